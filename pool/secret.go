package pool

import (
	"crypto/rand"
	"encoding/hex"
)

// RandomHex returns n random bytes from crypto/rand, hex-encoded: the
// pool's ids, instances, tokens and secrets.
func RandomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux ≥ 3.17
	}
	return hex.EncodeToString(b)
}
