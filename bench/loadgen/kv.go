package loadgen

import "fmt"

// KeyLen is the length of every key: "key:" and nine decimal digits.
const KeyLen = 13

// MaxKeys is the number of distinct keys Key can write.
const MaxKeys = 1_000_000_000

// Key writes the key of index i (< MaxKeys) into dst, which must hold
// KeyLen bytes, and returns dst[:KeyLen].
func Key(dst []byte, i uint64) []byte {
	dst = dst[:KeyLen]
	copy(dst, "key:")
	for j := KeyLen - 1; j >= 4; j-- {
		dst[j] = byte('0' + i%10)
		i /= 10
	}
	return dst
}

// Value writes the value of key index i into dst, all of it: the key, a
// colon, then printable bytes from a generator seeded with i. Each key has
// its own value, so a value returned for the wrong key, a stale or
// shifted page, or zeros all differ from it.
func Value(dst []byte, i uint64) []byte {
	var k [KeyLen]byte
	n := copy(dst, Key(k[:], i))
	if n < len(dst) {
		dst[n] = ':'
		n++
	}
	s := i*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	for n < len(dst) {
		// splitmix64: eight bytes per step, six bits of each made printable.
		s += 0x9e3779b97f4a7c15
		z := s
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		for b := 0; b < 8 && n < len(dst); b++ {
			dst[n] = '0' + byte(z>>(8*b))&63
			n++
		}
	}
	return dst
}

// describeWrong says how got differs from want, for a report of the first
// wrong value of a run (not on a hot path).
func describeWrong(key []byte, got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("key %s: %d bytes, want %d (starts %q)", key, len(got), len(want), head(got))
	}
	for i := range got {
		if got[i] != want[i] {
			zeros := 0
			for _, b := range got {
				if b == 0 {
					zeros++
				}
			}
			return fmt.Sprintf("key %s: first wrong byte at offset %d of %d (%d zero bytes); got %q, want %q",
				key, i, len(got), zeros, head(got[i:]), head(want[i:]))
		}
	}
	return fmt.Sprintf("key %s: equal", key)
}

func head(b []byte) []byte { return b[:min(len(b), 24)] }
