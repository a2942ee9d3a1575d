// Package queue is the client-side send/completion ring shared by the rdma
// providers: a bounded ring of posted work requests that complete in order
// (RC semantics), with Poll and Wait for the caller.
//
// It is not a general queue: it knows rdma's WorkRequest and Completion,
// holds at most depth outstanding requests and never allocates after New.
//
// # Concurrency
//
// Enqueue must be serialized by the provider (its post lock) so that ring
// order equals wire order. Next/Complete/Fail are called by one completer
// at a time (the tcp reply reader, or the poster for synchronous
// providers). Poll, Wait and Close may be called from any goroutine.
package queue
