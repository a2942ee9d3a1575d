//go:build !verbs

package verbs

import (
	"context"

	"rmem/rdma"
)

// Built is true when the package was built with the verbs tag.
const Built = false

// notBuilt is the "verbs" provider of a binary built without the tag: it
// exists so that asking for verbs names the missing build tag instead of
// reporting an unknown provider.
type notBuilt struct{}

func (notBuilt) Dial(context.Context, string, rdma.DialOptions) (rdma.Conn, error) {
	return nil, ErrNotBuilt
}

func (notBuilt) Listen(string, *rdma.Domain, rdma.ListenOptions) (rdma.Listener, error) {
	return nil, ErrNotBuilt
}

func init() { rdma.RegisterProvider("verbs", notBuilt{}) }

// Devices fails with ErrNotBuilt.
func Devices() ([]string, error) { return nil, ErrNotBuilt }
