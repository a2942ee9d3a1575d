package slabio

import (
	"errors"
	"fmt"
	"unsafe"
)

// localRegistrar is implemented by the connections of providers that can
// move data directly between registered local memory and the device
// (rmem/rdma/verbs: verbs.LocalRegistrar). Declared here so that slabio
// needs no cgo: tcp, shm and mem connections do not implement it.
type localRegistrar interface {
	RegisterLocal(mem []byte) error
}

// MaxLocal bounds the ranges RegisterLocal accepts per IO (the verbs
// provider takes 16 per connection).
const MaxLocal = 8

// Errors of RegisterLocal.
var (
	ErrLocalOverlap = errors.New("slabio: local memory overlaps a registered range")
	ErrTooManyLocal = fmt.Errorf("slabio: more than %d registered local ranges", MaxLocal)
	ErrLocalEmpty   = errors.New("slabio: RegisterLocal of empty memory")
)

// RegisterLocal names mem as a long-lived buffer that the IO's ops use as
// Buf (the pager's read buffers and staging slots): every connection the
// IO has or dials later registers it if its provider can (verbs), so ops
// whose Buf lies inside it move without the provider's bounce copy. Other
// providers ignore it. mem must stay valid, and Go memory is pinned, until
// Close. A connection that refuses the registration (RLIMIT_MEMLOCK, too
// many ranges) still moves the pages, through its bounce buffer; Stats
// counts registrations taken (LocalRegistered) and refused (LocalRefused).
func (io *IO) RegisterLocal(mem []byte) error {
	if len(mem) == 0 {
		return ErrLocalEmpty
	}
	if len(io.locals) >= MaxLocal {
		return ErrTooManyLocal
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	end := start + uintptr(len(mem))
	for _, l := range io.locals {
		ls := uintptr(unsafe.Pointer(unsafe.SliceData(l)))
		if start < ls+uintptr(len(l)) && ls < end {
			return ErrLocalOverlap
		}
	}
	io.locals = append(io.locals, mem)
	for _, p := range io.peers {
		if p.c != nil {
			io.register(p, mem)
		}
	}
	return nil
}

// register registers mem with p's connection if its provider can.
func (io *IO) register(p *peer, mem []byte) {
	lr, ok := p.c.(localRegistrar)
	if !ok {
		return
	}
	if err := lr.RegisterLocal(mem); err != nil {
		io.t.localRefused.Add(1)
		return
	}
	io.t.localRegistered.Add(1)
}
