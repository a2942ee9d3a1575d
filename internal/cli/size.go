package cli

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Size is a number of bytes given by a person: "512MiB", "4G", "65536".
type Size uint64

var errSizeSyntax = errors.New("want a byte count such as 4096, 64KiB, 512MiB or 2GiB")

var sizeUnits = []struct {
	suffix string
	mult   uint64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1000}, {"mb", 1000 * 1000}, {"gb", 1000 * 1000 * 1000}, {"tb", 1000 * 1000 * 1000 * 1000},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// ParseSize parses a size. Binary suffixes (KiB, MiB, GiB, TiB and the
// shorthands K, M, G, T) are powers of 1024; KB, MB, GB, TB are powers of
// 1000. Case is ignored, fractions are allowed ("1.5GiB"), a result that does
// not fit in 64 bits is an error.
func ParseSize(s string) (Size, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, errSizeSyntax
	}
	mult := uint64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			mult = u.mult
			t = strings.TrimSpace(strings.TrimSuffix(t, u.suffix))
			break
		}
	}
	if n, err := strconv.ParseUint(t, 10, 64); err == nil {
		if n != 0 && mult > math.MaxUint64/n {
			return 0, fmt.Errorf("%q is too large", s)
		}
		return Size(n * mult), nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, errSizeSyntax
	}
	v := f * float64(mult)
	if v >= math.MaxUint64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return Size(v), nil
}

// String formats the size with the largest binary unit that divides it, or
// with two decimals of the largest unit below it.
func (s Size) String() string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	v := uint64(s)
	i := 0
	for i < len(units)-1 && v >= 1024 && v%1024 == 0 {
		v /= 1024
		i++
	}
	if v < 1024 || i == len(units)-1 {
		return strconv.FormatUint(v, 10) + units[i]
	}
	f := float64(s)
	i = 0
	for i < len(units)-1 && f >= 1024 {
		f /= 1024
		i++
	}
	return strconv.FormatFloat(f, 'f', 2, 64) + units[i]
}

// Set implements pflag.Value, so that a Size can be a flag.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// Type implements pflag.Value.
func (s *Size) Type() string { return "size" }

// MarshalText implements encoding.TextMarshaler.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *Size) UnmarshalText(b []byte) error { return s.Set(string(b)) }
