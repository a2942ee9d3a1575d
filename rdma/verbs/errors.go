package verbs

import "errors"

// Errors. Both say in one line which provider is missing and why.
var (
	// ErrNotBuilt is returned by Dial and Listen of a binary built without
	// the verbs build tag.
	ErrNotBuilt = errors.New("rdma: provider verbs not built in: rebuild with -tags verbs (needs libibverbs-dev)")
	// ErrNoDevice is wrapped when no usable RDMA device is found; the
	// wrapping error carries the libibverbs cause, e.g.
	// "rdma: verbs: no RDMA device (ibv_get_device_list: function not implemented)".
	ErrNoDevice = errors.New("rdma: verbs: no RDMA device")
)
