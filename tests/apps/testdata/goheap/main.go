// Command goheap is a Go program that does not use rmem/client
// (TestGoProgram): os.Args[1] MiB of words written, read back at random
// and summed, then garbage made and given back to the kernel
// (debug.FreeOSMemory: madvise), whose pages must read back as zeros.
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
)

func main() {
	mib, _ := strconv.Atoi(os.Args[1])
	n := uint64(mib) << 20 / 8
	a := make([]uint64, n)
	for i := range a {
		a[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	var sum uint64
	x := uint64(88172645463325252)
	for k := 0; n > 0 && k < 100000; k++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		i := x % n
		if a[i] != i*0x9E3779B97F4A7C15 {
			fmt.Println("BAD", i)
			os.Exit(1)
		}
		sum += a[i]
	}
	for r := 0; n > 0 && r < 3; r++ {
		b := make([]byte, 16<<20)
		for i := range b {
			if b[i] != 0 {
				fmt.Println("BAD garbage", r, i)
				os.Exit(1)
			}
			b[i] = byte(i)
		}
		b = nil
		debug.FreeOSMemory()
	}
	fmt.Println(mib, "MiB:", sum, len(a))
}
