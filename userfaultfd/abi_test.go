package userfaultfd

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// ioc computes an ioctl number like the kernel's _IOC macro on x86/arm64.
func ioc(dir, typ, nr, size uint64) uint64 {
	return dir<<30 | size<<16 | typ<<8 | nr
}

const (
	iocRead  = 2 // _IOC_READ
	iocRW    = 3 // _IOC_READ|_IOC_WRITE
	iocWrite = 1
)

func sizeOf[T any]() uint64 { return uint64(reflect.TypeFor[T]().Size()) }

func offsetOf[T any](field string) uint64 {
	f, ok := reflect.TypeFor[T]().FieldByName(field)
	if !ok {
		panic("no field " + field)
	}
	return uint64(f.Offset)
}

// goABI is what this package believes, keyed like testdata/abi.c prints.
func goABI() map[string]uint64 {
	return map[string]uint64{
		"size uffdio_api":          sizeOf[uffdioAPI](),
		"size uffdio_range":        sizeOf[uffdioRange](),
		"size uffdio_register":     sizeOf[uffdioRegister](),
		"size uffdio_copy":         sizeOf[uffdioCopy](),
		"size uffdio_zeropage":     sizeOf[uffdioZeropage](),
		"size uffdio_writeprotect": sizeOf[uffdioWriteprotect](),
		"size uffdio_continue":     sizeOf[uffdioContinue](),
		"size uffdio_poison":       sizeOf[uffdioPoison](),
		"size uffdio_move":         sizeOf[uffdioMove](),
		"size uffd_msg":            sizeOf[uffdMsg](),
		"size pm_scan_arg":         sizeOf[pmScanArg](),
		"size page_region":         sizeOf[pageRegion](),

		"off uffdio_api.features":              offsetOf[uffdioAPI]("Features"),
		"off uffdio_api.ioctls":                offsetOf[uffdioAPI]("Ioctls"),
		"off uffdio_register.mode":             offsetOf[uffdioRegister]("Mode"),
		"off uffdio_register.ioctls":           offsetOf[uffdioRegister]("Ioctls"),
		"off uffdio_copy.src":                  offsetOf[uffdioCopy]("Src"),
		"off uffdio_copy.len":                  offsetOf[uffdioCopy]("Len"),
		"off uffdio_copy.mode":                 offsetOf[uffdioCopy]("Mode"),
		"off uffdio_copy.copy":                 offsetOf[uffdioCopy]("Copy"),
		"off uffdio_zeropage.mode":             offsetOf[uffdioZeropage]("Mode"),
		"off uffdio_zeropage.zeropage":         offsetOf[uffdioZeropage]("Zeropage"),
		"off uffdio_writeprotect.mode":         offsetOf[uffdioWriteprotect]("Mode"),
		"off uffdio_continue.mode":             offsetOf[uffdioContinue]("Mode"),
		"off uffdio_continue.mapped":           offsetOf[uffdioContinue]("Mapped"),
		"off uffdio_move.mode":                 offsetOf[uffdioMove]("Mode"),
		"off uffdio_move.move":                 offsetOf[uffdioMove]("Move"),
		"off uffdio_poison.mode":               offsetOf[uffdioPoison]("Mode"),
		"off uffdio_poison.updated":            offsetOf[uffdioPoison]("Updated"),
		"off pm_scan_arg.walk_end":             offsetOf[pmScanArg]("WalkEnd"),
		"off pm_scan_arg.vec":                  offsetOf[pmScanArg]("Vec"),
		"off pm_scan_arg.return_mask":          offsetOf[pmScanArg]("ReturnMask"),
		"off page_region.categories":           offsetOf[pageRegion]("Categories"),
		"off uffd_msg.arg.pagefault.flags":     msgOffArg,
		"off uffd_msg.arg.pagefault.address":   msgOffArg2,
		"off uffd_msg.arg.pagefault.feat.ptid": msgOffArg3,
		"off uffd_msg.arg.fork.ufd":            msgOffArg,
		"off uffd_msg.arg.remap.from":          msgOffArg,
		"off uffd_msg.arg.remap.to":            msgOffArg2,
		"off uffd_msg.arg.remap.len":           msgOffArg3,
		"off uffd_msg.arg.remove.start":        msgOffArg,
		"off uffd_msg.arg.remove.end":          msgOffArg2,

		"ioctl USERFAULTFD_IOC_NEW": iocUserfaultfdNew,
		"ioctl UFFDIO_API":          iocAPI,
		"ioctl UFFDIO_REGISTER":     iocRegister,
		"ioctl UFFDIO_UNREGISTER":   iocUnregister,
		"ioctl UFFDIO_WAKE":         iocWake,
		"ioctl UFFDIO_COPY":         iocCopy,
		"ioctl UFFDIO_ZEROPAGE":     iocZeropage,
		"ioctl UFFDIO_WRITEPROTECT": iocWriteprotect,
		"ioctl UFFDIO_CONTINUE":     iocContinue,
		"ioctl UFFDIO_MOVE":         iocMove,
		"ioctl UFFDIO_POISON":       iocPoison,
		"ioctl PAGEMAP_SCAN":        iocPagemapScan,
	}
}

// TestABILayout checks the kernel sizes from the uapi headers (as of Linux
// 6.8) and the ioctl numbers computed from them.
func TestABILayout(t *testing.T) {
	got := goABI()
	want := map[string]uint64{
		"size uffdio_api": 24, "size uffdio_range": 16, "size uffdio_register": 32,
		"size uffdio_copy": 40, "size uffdio_zeropage": 32, "size uffdio_writeprotect": 24,
		"size uffdio_continue": 32, "size uffdio_poison": 32, "size uffdio_move": 40,
		"size uffd_msg": 32, "size pm_scan_arg": 96, "size page_region": 24,
		"off pm_scan_arg.walk_end": 32, "off pm_scan_arg.vec": 40, "off pm_scan_arg.return_mask": 88,
		"off uffdio_copy.copy": 32, "off uffdio_move.move": 32,

		"ioctl USERFAULTFD_IOC_NEW": ioc(0, 0xAA, 0x00, 0),
		"ioctl UFFDIO_API":          ioc(iocRW, 0xAA, nrAPI, 24),
		"ioctl UFFDIO_REGISTER":     ioc(iocRW, 0xAA, nrRegister, 32),
		"ioctl UFFDIO_UNREGISTER":   ioc(iocRead, 0xAA, nrUnregister, 16),
		"ioctl UFFDIO_WAKE":         ioc(iocRead, 0xAA, nrWake, 16),
		"ioctl UFFDIO_COPY":         ioc(iocRW, 0xAA, nrCopy, 40),
		"ioctl UFFDIO_ZEROPAGE":     ioc(iocRW, 0xAA, nrZeropage, 32),
		"ioctl UFFDIO_MOVE":         ioc(iocRW, 0xAA, nrMove, 40),
		"ioctl UFFDIO_WRITEPROTECT": ioc(iocRW, 0xAA, nrWriteprotect, 24),
		"ioctl UFFDIO_CONTINUE":     ioc(iocRW, 0xAA, nrContinue, 32),
		"ioctl UFFDIO_POISON":       ioc(iocRW, 0xAA, nrPoison, 32),
		"ioctl PAGEMAP_SCAN":        ioc(iocRW, 'f', 16, 96),
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %d, want %d", k, got[k], w)
		}
	}
	// The ioctl sizes must be the Go struct sizes.
	for name, size := range map[string]uint64{
		"UFFDIO_API": sizeOf[uffdioAPI](), "UFFDIO_REGISTER": sizeOf[uffdioRegister](),
		"UFFDIO_COPY": sizeOf[uffdioCopy](), "UFFDIO_MOVE": sizeOf[uffdioMove](),
		"PAGEMAP_SCAN": sizeOf[pmScanArg](), "UFFDIO_WAKE": sizeOf[uffdioRange](),
	} {
		if s := got["ioctl "+name] >> 16 & 0x3FFF; s != size {
			t.Errorf("%s encodes size %d, Go struct is %d", name, s, size)
		}
	}
	if MsgSize != sizeOf[uffdMsg]() || uint64(len(Msg{})) != MsgSize {
		t.Errorf("Msg is %d bytes, uffd_msg %d", len(Msg{}), sizeOf[uffdMsg]())
	}
}

// TestABIAgainstC compiles testdata/abi.c against the installed kernel
// headers and compares everything it prints with this package's view.
func TestABIAgainstC(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed: cannot compare with the C headers")
	}
	bin := filepath.Join(t.TempDir(), "abi")
	if out, err := exec.Command(gcc, "-o", bin, "testdata/abi.c").CombinedOutput(); err != nil {
		t.Skipf("cannot build testdata/abi.c (kernel headers missing? apt-get install linux-libc-dev): %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	ours := goABI()
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		key, val := line[:i], line[i+1:]
		v, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			t.Fatalf("bad line %q", line)
		}
		g, ok := ours[key]
		if !ok {
			t.Errorf("C prints %q, which the test does not know", key)
			continue
		}
		seen++
		if g != v {
			t.Errorf("%s: Go %d (%#x), C %d (%#x)", key, g, g, v, v)
		}
	}
	t.Logf("compared %d values with the C headers", seen)
}
