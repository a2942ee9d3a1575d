package faultproxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestChaosProxyForwardsInOrder: through 1% loss, 2ms delay and 1ms
// jitter, every byte of two concurrent streams arrives, in order; the
// counters saw the faults.
func TestChaosProxyForwardsInOrder(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := New(ln, echo.Addr().String(), nil, 7)
	defer p.Close()
	p.SetFaults(Faults{Delay: 2 * time.Millisecond, Jitter: time.Millisecond, Loss: 0.01, RTO: 20 * time.Millisecond})
	errs := make(chan error, 2)
	for k := range 2 {
		go func() {
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			want := make([]byte, 4<<20)
			rnd := rand.New(rand.NewPCG(uint64(k), 1))
			for i := range want {
				want[i] = byte(rnd.Uint32())
			}
			go func() {
				for off := 0; off < len(want); off += 1000 {
					c.Write(want[off:min(off+1000, len(want))])
				}
				c.(*net.TCPConn).CloseWrite()
			}()
			got, err := io.ReadAll(c)
			if err == nil && !bytes.Equal(got, want) {
				err = io.ErrUnexpectedEOF
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	st := p.Stats()
	if st.Conns != 2 || st.Bytes != 4*(4<<20) || st.Lost == 0 || st.Delayed < time.Duration(st.Chunks)*2*time.Millisecond {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("%+v", st)
}

// TestChaosProxySchedule: the fault schedule is a function of the seed:
// the same generator gives the same delays, and about Loss of the chunks
// are late by RTO.
func TestChaosProxySchedule(t *testing.T) {
	f := Faults{Delay: 2 * time.Millisecond, Jitter: time.Millisecond, Loss: 0.01, RTO: 200 * time.Millisecond}
	a, b := rand.New(rand.NewPCG(1, 2)), rand.New(rand.NewPCG(1, 2))
	lost := 0
	for range 100000 {
		da, la := Schedule(f, a)
		db, lb := Schedule(f, b)
		if da != db || la != lb {
			t.Fatal("same seed, different schedule")
		}
		if da < f.Delay || da >= f.Delay+f.Jitter+f.RTO || la != (da >= f.Delay+f.RTO) {
			t.Fatalf("delay %v lost %v", da, la)
		}
		if la {
			lost++
		}
	}
	if lost < 850 || lost > 1150 {
		t.Fatalf("%d of 100000 chunks lost, want about 1000", lost)
	}
}
