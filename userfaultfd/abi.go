package userfaultfd

// The kernel ABI: every struct and constant of linux/userfaultfd.h and the
// PAGEMAP_SCAN part of linux/fs.h that this package uses, in one place.
// abi_test.go checks sizes, field offsets and ioctl numbers against the
// kernel's definitions. Pointer plumbing lives in abi_unsafe.go.

const (
	uffdAPI = 0xAA

	// USERFAULTFD_IOC_NEW = _IO(0xAA, 0x00), on /dev/userfaultfd.
	iocUserfaultfdNew = 0xAA00

	// ioctl numbers: _IOWR(0xAA, nr, struct) = 3<<30 | size<<16 | 0xAA<<8 | nr,
	// _IOR = 2<<30 | ... (UNREGISTER and WAKE are _IOR for historical reasons).
	iocAPI          = 0xC018AA3F // _IOWR(UFFDIO, 0x3F, struct uffdio_api)
	iocRegister     = 0xC020AA00 // _IOWR(UFFDIO, 0x00, struct uffdio_register)
	iocUnregister   = 0x8010AA01 // _IOR(UFFDIO, 0x01, struct uffdio_range)
	iocWake         = 0x8010AA02 // _IOR(UFFDIO, 0x02, struct uffdio_range)
	iocCopy         = 0xC028AA03 // _IOWR(UFFDIO, 0x03, struct uffdio_copy)
	iocZeropage     = 0xC020AA04 // _IOWR(UFFDIO, 0x04, struct uffdio_zeropage)
	iocMove         = 0xC028AA05 // _IOWR(UFFDIO, 0x05, struct uffdio_move)
	iocWriteprotect = 0xC018AA06 // _IOWR(UFFDIO, 0x06, struct uffdio_writeprotect)
	iocContinue     = 0xC020AA07 // _IOWR(UFFDIO, 0x07, struct uffdio_continue)
	iocPoison       = 0xC020AA08 // _IOWR(UFFDIO, 0x08, struct uffdio_poison)
	iocPagemapScan  = 0xC0606610 // _IOWR('f', 16, struct pm_scan_arg)

	// _UFFDIO_* bit numbers reported in uffdio_api.ioctls and
	// uffdio_register.ioctls.
	nrRegister     = 0x00
	nrUnregister   = 0x01
	nrWake         = 0x02
	nrCopy         = 0x03
	nrZeropage     = 0x04
	nrMove         = 0x05
	nrWriteprotect = 0x06
	nrContinue     = 0x07
	nrPoison       = 0x08
	nrAPI          = 0x3F

	regModeMissing = 1 << 0
	regModeWP      = 1 << 1
	regModeMinor   = 1 << 2

	copyModeDontwake     = 1 << 0
	copyModeWP           = 1 << 1
	zeropageModeDontwake = 1 << 0
	wpModeWP             = 1 << 0
	wpModeDontwake       = 1 << 1
	continueModeDontwake = 1 << 0
	continueModeWP       = 1 << 1
	poisonModeDontwake   = 1 << 0
	moveModeDontwake     = 1 << 0
	moveModeAllowSrcHole = 1 << 1

	eventPagefault = 0x12
	eventFork      = 0x13
	eventRemap     = 0x14
	eventRemove    = 0x15
	eventUnmap     = 0x16

	// PAGEMAP_SCAN flags and page categories.
	pmScanWPMatching   = 1 << 0
	pmScanCheckWPAsync = 1 << 1
	pageIsWritten      = 1 << 1
)

// struct uffdio_api (24 bytes).
type uffdioAPI struct {
	API      uint64
	Features uint64
	Ioctls   uint64
}

// struct uffdio_range (16 bytes).
type uffdioRange struct {
	Start uint64
	Len   uint64
}

// struct uffdio_register (32 bytes).
type uffdioRegister struct {
	Range  uffdioRange
	Mode   uint64
	Ioctls uint64 // written by the kernel
}

// struct uffdio_copy (40 bytes). Src points into the caller's memory; it is
// a pointer so that the garbage collector and stack copying see it.
type uffdioCopy struct {
	Dst  uint64
	Src  *byte
	Len  uint64
	Mode uint64
	Copy int64 // written by the kernel: bytes copied or -errno
}

// struct uffdio_zeropage (32 bytes).
type uffdioZeropage struct {
	Range    uffdioRange
	Mode     uint64
	Zeropage int64 // written by the kernel
}

// struct uffdio_writeprotect (24 bytes).
type uffdioWriteprotect struct {
	Range uffdioRange
	Mode  uint64
}

// struct uffdio_continue (32 bytes).
type uffdioContinue struct {
	Range  uffdioRange
	Mode   uint64
	Mapped int64 // written by the kernel
}

// struct uffdio_poison (32 bytes).
type uffdioPoison struct {
	Range   uffdioRange
	Mode    uint64
	Updated int64 // written by the kernel
}

// struct uffdio_move (40 bytes). Both addresses are in the served mm.
type uffdioMove struct {
	Dst  uint64
	Src  uint64
	Len  uint64
	Mode uint64
	Move int64 // written by the kernel
}

// struct uffd_msg (32 bytes, packed). Decoding works on bytes (see
// DecodeMsg); this type only documents and tests the layout.
type uffdMsg struct {
	Event     uint8
	Reserved1 uint8
	Reserved2 uint16
	Reserved3 uint32
	Arg       [3]uint64
}

// Byte offsets inside struct uffd_msg.
const (
	msgOffEvent     = 0
	msgOffArg       = 8  // pagefault.flags, fork.ufd, remap.from, remove.start
	msgOffArg2      = 16 // pagefault.address, remap.to, remove.end
	msgOffArg3      = 24 // pagefault.feat.ptid, remap.len
	msgSizeUffdMsg  = 32
	pmScanArgSize   = 96
	pageRegionBytes = 24
)

// struct pm_scan_arg (96 bytes), linux/fs.h.
type pmScanArg struct {
	Size              uint64
	Flags             uint64
	Start             uint64
	End               uint64
	WalkEnd           uint64 // written by the kernel
	Vec               *pageRegion
	VecLen            uint64
	MaxPages          uint64
	CategoryInverted  uint64
	CategoryMask      uint64
	CategoryAnyofMask uint64
	ReturnMask        uint64
}

// struct page_region (24 bytes), linux/fs.h.
type pageRegion struct {
	Start      uint64
	End        uint64
	Categories uint64
}
