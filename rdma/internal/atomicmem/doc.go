// Package atomicmem performs 64-bit atomic operations on words inside byte
// slices (registered memory, possibly shared with other processes).
//
// It is the only place in rdma that turns bytes into *uint64; it is not a
// general unsafe toolbox. Words are in host byte order.
package atomicmem
