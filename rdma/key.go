package rdma

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// KeySize is the length of a Key in bytes (128 random bits).
const KeySize = 16

// Key is a remote key: a capability naming one range of one registered
// region with an access right. It is 128 bits from crypto/rand, so it cannot
// be guessed; whoever holds it may use it until it is revoked.
//
// Unlike a verbs rkey (32 bits, paired with a virtual address), a Key alone
// addresses its range: a work request's offset is relative to the start of
// the key's range.
type Key [KeySize]byte

// NewKey returns a fresh random key.
func NewKey() (Key, error) {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return Key{}, fmt.Errorf("rdma: generating key: %w", err)
	}
	return k, nil
}

// IsZero reports whether k is the zero key, which is never issued.
func (k Key) IsZero() bool { return k == Key{} }

// String returns the key as 32 lowercase hex digits.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// ParseKey parses the 32-hex-digit form produced by String.
func ParseKey(s string) (Key, error) {
	var k Key
	if len(s) != 2*KeySize {
		return Key{}, fmt.Errorf("%w: want %d hex digits, got %d", ErrBadKey, 2*KeySize, len(s))
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return Key{}, fmt.Errorf("%w: %w", ErrBadKey, err)
	}
	return k, nil
}

// MarshalText implements encoding.TextMarshaler (hex), so keys travel in JSON.
func (k Key) MarshalText() ([]byte, error) {
	b := make([]byte, 2*KeySize)
	hex.Encode(b, k[:])
	return b, nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (k *Key) UnmarshalText(b []byte) error {
	p, err := ParseKey(string(b))
	if err != nil {
		return err
	}
	*k = p
	return nil
}
