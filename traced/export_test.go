package traced

import (
	"go.uber.org/zap"

	"rmem/userfaultfd"
)

// HelloFor says HELLO for pid with a uffd of this process's own, as a
// tracer would.
func HelloFor(socket string, pid int) error {
	u, err := userfaultfd.Open(features)
	if err != nil {
		return err
	}
	defer u.Close()
	a, err := dial(socket, helloArgs{pid: pid, pidfd: -1}, u, nil, zap.NewNop())
	if err == nil {
		a.close()
	}
	return err
}
