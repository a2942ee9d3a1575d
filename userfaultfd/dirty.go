package userfaultfd

import (
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// DirtyScanner finds the pages written since the last scan in a range
// registered with ModeWP on a UFFD opened with FeatureWPAsync, and
// write-protects them again in the same step (PAGEMAP_SCAN with
// PM_SCAN_WP_MATCHING on /proc/PID/pagemap, Linux 6.7). Writes to
// protected pages are resolved by the kernel without any message.
//
// A DirtyScanner is not safe for concurrent use; it allocates nothing per
// Scan beyond what appending to dst needs.
type DirtyScanner struct {
	fd  int
	vec []pageRegion
}

// OpenDirtyScanner opens the pagemap of process pid (0 for this process).
// maxRegions bounds the regions one ioctl returns (the scan loops until
// the range is covered); 0 means 512.
func OpenDirtyScanner(pid, maxRegions int) (*DirtyScanner, error) {
	path := "/proc/self/pagemap"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/pagemap"
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("userfaultfd: open %s: %w", path, err)
	}
	if maxRegions <= 0 {
		maxRegions = 512
	}
	return &DirtyScanner{fd: fd, vec: make([]pageRegion, maxRegions)}, nil
}

// Close closes the pagemap file. Safe to call twice.
func (s *DirtyScanner) Close() error {
	if s.fd < 0 {
		return nil
	}
	fd := s.fd
	s.fd = -1
	return unix.Close(fd)
}

// Scan appends to dst the page-aligned ranges of r written since the last
// scan (or since WriteProtect), merging adjacent ones, and write-protects
// them again. r must be page aligned and lie in a range registered for
// asynchronous write protection, else the kernel refuses (EPERM).
func (s *DirtyScanner) Scan(r Range, dst []Range) ([]Range, error) {
	if err := pageRange(r); err != nil {
		return dst, err
	}
	end, _ := r.End()
	start := r.Start
	base := len(dst) // merge only with ranges this call appended
	for start < end {
		a := pmScanArg{
			Size:         pmScanArgSize,
			Flags:        pmScanWPMatching | pmScanCheckWPAsync,
			Start:        uint64(start),
			End:          uint64(end),
			Vec:          &s.vec[0],
			VecLen:       uint64(len(s.vec)),
			CategoryMask: pageIsWritten,
			ReturnMask:   pageIsWritten,
		}
		n, e := ioctlPagemapScan(s.fd, &a)
		if e != 0 {
			return dst, &OpError{Op: "pagemap scan", Range: Range{start, uint64(end - start)}, Err: e}
		}
		if n < 0 || n > len(s.vec) {
			return dst, fmt.Errorf("userfaultfd: pagemap scan returned %d regions for a %d-entry vector", n, len(s.vec))
		}
		for _, pr := range s.vec[:n] {
			got, ok := RangeFromTo(Addr(pr.Start), Addr(pr.End))
			if !ok || !r.ContainsRange(got) {
				return dst, fmt.Errorf("userfaultfd: pagemap scan region [%#x, %#x) outside %v", pr.Start, pr.End, r)
			}
			if k := len(dst) - 1; k >= base {
				if prevEnd, _ := dst[k].End(); prevEnd == got.Start {
					dst[k].Len += got.Len
					continue
				}
			}
			dst = append(dst, got)
		}
		walkEnd := Addr(a.WalkEnd)
		if walkEnd >= end {
			break
		}
		if walkEnd <= start {
			return dst, fmt.Errorf("userfaultfd: pagemap scan made no progress at %v", start)
		}
		start = walkEnd
	}
	return dst, nil
}
