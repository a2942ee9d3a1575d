package userfaultfd

import (
	"strconv"
	"strings"
)

// Feature is a set of UFFD_FEATURE_* bits negotiated in the API handshake.
type Feature uint64

// Features (linux/userfaultfd.h).
const (
	FeaturePagefaultFlagWP  Feature = 1 << 0
	FeatureEventFork        Feature = 1 << 1
	FeatureEventRemap       Feature = 1 << 2
	FeatureEventRemove      Feature = 1 << 3
	FeatureMissingHugetlbfs Feature = 1 << 4
	FeatureMissingShmem     Feature = 1 << 5
	FeatureEventUnmap       Feature = 1 << 6
	FeatureSigbus           Feature = 1 << 7
	FeatureThreadID         Feature = 1 << 8
	FeatureMinorHugetlbfs   Feature = 1 << 9
	FeatureMinorShmem       Feature = 1 << 10
	FeatureExactAddress     Feature = 1 << 11
	FeatureWPHugetlbfsShmem Feature = 1 << 12
	FeatureWPUnpopulated    Feature = 1 << 13
	FeaturePoison           Feature = 1 << 14
	FeatureWPAsync          Feature = 1 << 15
	FeatureMove             Feature = 1 << 16
)

var featureNames = [...]string{
	"PAGEFAULT_FLAG_WP", "EVENT_FORK", "EVENT_REMAP", "EVENT_REMOVE",
	"MISSING_HUGETLBFS", "MISSING_SHMEM", "EVENT_UNMAP", "SIGBUS",
	"THREAD_ID", "MINOR_HUGETLBFS", "MINOR_SHMEM", "EXACT_ADDRESS",
	"WP_HUGETLBFS_SHMEM", "WP_UNPOPULATED", "POISON", "WP_ASYNC", "MOVE",
}

// String lists the set bits by their kernel names, "0" for none.
func (f Feature) String() string {
	return bitNames(uint64(f), featureNames[:])
}

// Has reports whether all bits of x are in f.
func (f Feature) Has(x Feature) bool { return f&x == x }

// Mode selects which faults a registered range reports.
type Mode uint64

const (
	// ModeMissing reports faults on pages that are not populated.
	ModeMissing Mode = regModeMissing
	// ModeWP reports writes to write-protected pages.
	ModeWP Mode = regModeWP
	// ModeMinor reports faults on shmem/hugetlbfs pages that are in the
	// page cache but not mapped (resolved with Continue).
	ModeMinor Mode = regModeMinor
)

func (m Mode) String() string {
	return bitNames(uint64(m), []string{"MISSING", "WP", "MINOR"})
}

// Ioctls is the set of ioctls the kernel granted, for the fd (after the
// handshake) or for a registered range (after Register).
type Ioctls uint64

// Ioctls by _UFFDIO_* number.
const (
	IoctlRegister     Ioctls = 1 << nrRegister
	IoctlUnregister   Ioctls = 1 << nrUnregister
	IoctlWake         Ioctls = 1 << nrWake
	IoctlCopy         Ioctls = 1 << nrCopy
	IoctlZeroPage     Ioctls = 1 << nrZeropage
	IoctlMove         Ioctls = 1 << nrMove
	IoctlWriteProtect Ioctls = 1 << nrWriteprotect
	IoctlContinue     Ioctls = 1 << nrContinue
	IoctlPoison       Ioctls = 1 << nrPoison
	IoctlAPI          Ioctls = 1 << nrAPI
)

// Has reports whether all of x are granted.
func (i Ioctls) Has(x Ioctls) bool { return i&x == x }

var ioctlNames = [...]string{
	nrRegister: "REGISTER", nrUnregister: "UNREGISTER", nrWake: "WAKE",
	nrCopy: "COPY", nrZeropage: "ZEROPAGE", nrMove: "MOVE",
	nrWriteprotect: "WRITEPROTECT", nrContinue: "CONTINUE",
	nrPoison: "POISON", nrAPI: "API",
}

func (i Ioctls) String() string {
	return bitNames(uint64(i), ioctlNames[:])
}

func bitNames(v uint64, names []string) string {
	if v == 0 {
		return "0"
	}
	var parts []string
	for b := range 64 {
		if v&(1<<b) == 0 {
			continue
		}
		if b < len(names) && names[b] != "" {
			parts = append(parts, names[b])
		} else {
			parts = append(parts, "bit"+strconv.Itoa(b))
		}
	}
	return strings.Join(parts, "|")
}
