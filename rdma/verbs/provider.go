//go:build verbs

package verbs

import (
	"context"
	"fmt"

	"rmem/rdma"
)

// Built is true when the package was built with the verbs tag.
const Built = true

type provider struct{}

func (provider) Dial(ctx context.Context, addr string, opts rdma.DialOptions) (rdma.Conn, error) {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return dial(ctx, addr, opts, cfg)
}

func (provider) Listen(addr string, d *rdma.Domain, opts rdma.ListenOptions) (rdma.Listener, error) {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return listen(addr, d, opts, cfg)
}

func init() { rdma.RegisterProvider("verbs", provider{}) }

// Devices lists the RDMA devices and their ports ("rxe0/1"), or fails
// with an error wrapping ErrNoDevice that says why, in one line.
func Devices() ([]string, error) {
	devs, err := listDevices()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(devs))
	for _, d := range devs {
		out = append(out, fmt.Sprintf("%s/%d", d.Name, d.Port))
	}
	return out, nil
}
