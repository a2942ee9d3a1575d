// Package proto is the wire protocol between an application process (the
// LD_PRELOAD shim in preload/, or the Go client library) and memagent: one
// SOCK_SEQPACKET packet per message, a 16-byte little-endian header
// {magic "RMEM", version, type, seq, len} and a fixed-layout body, file
// descriptors as SCM_RIGHTS. The C side mirrors this package in
// preload/proto.h; docs/pager.md has the message table and the rules
// (who sends what, in which order).
//
// It is NOT the agent or the shim: it encodes, decodes, validates the
// structure of messages and moves packets over a socket. Whether a region
// is acceptable or a page is resident is the agent's business.
//
// # Encoding and decoding
//
// Every message type has Encode(b, seq), which appends the whole packet
// to b and allocates nothing when b has room (MaxPacket bytes always
// suffice), and Decode(body), which is pure and bounds-checked. A packet
// is split by Parse into its Header and body; Decode(packet) does both and
// returns the message as an interface (it allocates; for tests and tools).
// Decoding is strict: wrong magic, unknown version or type, a body length
// that is not the one the type has, nonzero reserved fields and unknown
// kinds are errors wrapping ErrMalformed (or ErrVersion, ErrType), so a
// decoded message re-encodes to the same bytes.
//
// # Compatibility
//
// Version 2 (version 1 had no NoSlot EVICT entries and at most 64 of
// them). Changes are additive: a new message type, or a new flag bit that
// old peers may ignore. A change of any existing layout or meaning bumps
// Version.
//
// # Concurrency
//
// Nothing here keeps state; Send and Recv may be used from several
// goroutines on one socket (each packet is atomic on SOCK_SEQPACKET), but
// each caller needs its own buffers.
package proto
