package userfaultfd

import (
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// SendFDs sends payload and fds over conn in one message (SCM_RIGHTS). An
// empty payload is sent as one zero byte, since a stream socket cannot
// carry descriptors without data. The fds stay open in the sender.
func SendFDs(conn *net.UnixConn, payload []byte, fds ...int) error {
	if len(payload) == 0 {
		payload = []byte{0}
	}
	oob := unix.UnixRights(fds...)
	n, oobn, err := conn.WriteMsgUnix(payload, oob, nil)
	if err != nil {
		return fmt.Errorf("userfaultfd: send %d fds: %w", len(fds), err)
	}
	if n != len(payload) || oobn != len(oob) {
		return fmt.Errorf("%w: short send (%d/%d bytes, %d/%d control)", ErrFDPass, n, len(payload), oobn, len(oob))
	}
	return nil
}

// RecvFDs receives one message sent by SendFDs: its data into payload and
// up to len(fds) descriptors (close-on-exec) into fds. It returns the data
// length and the number of descriptors received. If the sender sent more
// descriptors than fit, the kernel truncates them: every one received is
// closed and the error wraps ErrFDPass. At end of stream it returns io.EOF.
func RecvFDs(conn *net.UnixConn, payload []byte, fds []int) (n, nfds int, err error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, 0, fmt.Errorf("userfaultfd: recv fds: %w", err)
	}
	oob := make([]byte, unix.CmsgSpace(4*max(len(fds), 1)))
	var oobn, flags int
	var rerr error
	err = raw.Read(func(fd uintptr) bool {
		n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), payload, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, 0, fmt.Errorf("userfaultfd: recv fds: %w", err)
	}
	var got []int
	msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
	if perr != nil {
		return 0, 0, fmt.Errorf("%w: %w", ErrFDPass, perr)
	}
	for _, m := range msgs {
		rights, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue // another control message type
		}
		got = append(got, rights...)
	}
	if flags&unix.MSG_CTRUNC != 0 || len(got) > len(fds) {
		closeAll(got)
		return 0, 0, fmt.Errorf("%w: more descriptors than the %d expected", ErrFDPass, len(fds))
	}
	if n == 0 && len(got) == 0 {
		return 0, 0, io.EOF
	}
	return n, copy(fds, got), nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// PeerCred returns the pid, uid and gid of the process at the other end
// of conn, as the kernel recorded them at connect (SO_PEERCRED).
func PeerCred(conn *net.UnixConn) (*unix.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("userfaultfd: peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("userfaultfd: peer credentials: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("userfaultfd: peer credentials: %w", cerr)
	}
	return cred, nil
}

// TakeFD duplicates file descriptor targetFD of the live process pid into
// this process (pidfd_open + pidfd_getfd, Linux 5.6), close-on-exec: for
// example to take back the uffd of an application after an agent restart.
// It needs ptrace access to pid (same user without restrictions, or
// CAP_SYS_PTRACE).
func TakeFD(pid, targetFD int) (int, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, fmt.Errorf("userfaultfd: pidfd_open(%d): %w", pid, err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, targetFD, 0)
	if err != nil {
		return -1, fmt.Errorf("userfaultfd: pidfd_getfd(pid %d, fd %d): %w (needs ptrace access to the process)", pid, targetFD, err)
	}
	return fd, nil
}
