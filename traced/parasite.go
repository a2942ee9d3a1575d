package traced

import (
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"rmem/procinfo"
)

// The command page (page 0 of the memfd both map; page 1 is the set-up's
// scratch): seq (the tracer's word), ack (the parasite's), n, then n
// {addr, len} ranges; the parasite leaves madvise's result in len.
const (
	cmdSize    = 2 * pageSize
	cmdSeq     = 0
	cmdAck     = 4
	cmdN       = 8
	cmdRanges  = 16
	maxRanges  = (pageSize - cmdRanges) / 16
	scratchOff = pageSize
)

// parasite is the program's thread that drops pages for the tracer.
type parasite struct {
	cmd []byte // the tracer's mapping of the command page
	pid int
	seq uint32
}

// pageSize is the only page size this package knows.
const pageSize = 4096

// drop has the parasite madvise(MADV_DONTNEED) each range and returns how
// many of them (from the first) were dropped, and the error of the first
// that failed.
func (p *parasite) drop(addrs, lens []uint64) (int, error) {
	for done := 0; done < len(addrs); {
		n := min(len(addrs)-done, maxRanges)
		le := binary.LittleEndian
		for i := 0; i < n; i++ {
			o := cmdRanges + 16*i
			le.PutUint64(p.cmd[o:], addrs[done+i])
			le.PutUint64(p.cmd[o+8:], lens[done+i])
		}
		word(p.cmd, cmdN).Store(uint32(n))
		p.seq++
		word(p.cmd, cmdSeq).Store(p.seq)
		futexWake(word(p.cmd, cmdSeq))
		if err := p.wait(); err != nil {
			return done, err
		}
		for i := 0; i < n; i++ {
			if r := int64(le.Uint64(p.cmd[cmdRanges+16*i+8:])); r != 0 {
				return done + i, fmt.Errorf("traced: the parasite's madvise(%#x): %w", addrs[done+i], unix.Errno(-r))
			}
		}
		done += n
	}
	return len(addrs), nil
}

// wait waits for the parasite's answer to command p.seq: it polls a
// while, then sleeps on the answer word, checking that the program lives.
func (p *parasite) wait() error {
	ack := word(p.cmd, cmdAck)
	for i := 0; i < 2000; i++ {
		if ack.Load() == p.seq {
			return nil
		}
	}
	ts := unix.NsecToTimespec(int64(50 * time.Millisecond))
	for {
		v := ack.Load()
		if v == p.seq {
			return nil
		}
		if procinfo.Exited(p.pid) {
			return fmt.Errorf("traced: the program exited: %w", unix.ESRCH)
		}
		futexWait(ack, v, &ts)
	}
}
