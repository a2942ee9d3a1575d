package pool

import (
	"fmt"
	"time"
)

// FieldError is a request error about one field. It wraps ErrInvalid.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return fmt.Sprintf("pool: invalid %s: %s", e.Field, e.Msg) }

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Limits on requests, so one request cannot make the coordinator allocate
// without bound.
const (
	MaxSlabsPerRequest = 4096
	MaxReplicas        = 8
	MinTTL             = 100 * time.Millisecond
	MaxTTL             = 24 * time.Hour
	maxName            = 253
)

func validName(field, s string) error {
	if s == "" {
		return fieldErr(field, "must not be empty")
	}
	if len(s) > maxName {
		return fieldErr(field, "longer than %d bytes", maxName)
	}
	for _, c := range s {
		if c <= ' ' || c == '/' || c == 0x7f {
			return fieldErr(field, "%q has a space, control character or slash", s)
		}
	}
	return nil
}

// Validate checks a registration.
func (s *ServerInfo) Validate() error {
	if err := validName("id", string(s.ID)); err != nil {
		return err
	}
	if s.Instance == "" {
		return fieldErr("instance", "must not be empty")
	}
	if s.SlabSize == 0 || s.SlabSize%4096 != 0 {
		return fieldErr("slab_size", "must be a positive multiple of 4096, got %d", s.SlabSize)
	}
	if s.Slabs < 0 || s.Slabs > 1<<24 {
		return fieldErr("slabs", "must be between 0 and %d, got %d", 1<<24, s.Slabs)
	}
	if len(s.Addrs) == 0 {
		return fieldErr("addrs", "must name at least one data-plane address")
	}
	for p, a := range s.Addrs {
		if p == "" || a == "" {
			return fieldErr("addrs", "empty provider or address")
		}
	}
	return nil
}

// Validate checks a lease request.
func (r *CreateLeaseRequest) Validate() error {
	if err := validName("agent", r.Agent); err != nil {
		return err
	}
	if r.Node != "" {
		if err := validName("node", r.Node); err != nil {
			return err
		}
	}
	if r.PID < 0 {
		return fieldErr("pid", "must not be negative")
	}
	if t := r.TTL.Std(); t < MinTTL || t > MaxTTL {
		return fieldErr("ttl", "must be between %v and %v, got %v", MinTTL, MaxTTL, t)
	}
	return nil
}

// Validate checks an allocation request.
func (r *AllocateRequest) Validate() error {
	if r.Slabs < 1 || r.Slabs > MaxSlabsPerRequest {
		return fieldErr("slabs", "must be between 1 and %d, got %d", MaxSlabsPerRequest, r.Slabs)
	}
	if r.Replicas < 1 || r.Replicas > MaxReplicas {
		return fieldErr("replicas", "must be between 1 and %d, got %d", MaxReplicas, r.Replicas)
	}
	if k, ok := StripeLayout(r.Layout); ok {
		if k < 1 || k > MaxSlabsPerRequest || r.Slabs%k != 0 {
			return fieldErr("layout", "%s: want K >= 1 and slabs a multiple of K, got %d slabs", r.Layout, r.Slabs)
		}
	} else if r.Layout != "" {
		red, err := ParseRedundancy(r.Layout)
		if err != nil || red.M == 0 {
			return fieldErr("layout", "want ec:K+M, got %q", r.Layout)
		}
		if red.K+red.M != r.Replicas {
			return fieldErr("layout", "%s needs %d replicas, got %d", r.Layout, red.K+red.M, r.Replicas)
		}
	}
	return nil
}
