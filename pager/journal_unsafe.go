package pager

import "unsafe"

// slotBytes and bytesSlots view a slot table as the bytes of its journal
// file and back (x86-64 and arm64: little endian, as the file's layout).
func slotBytes(s []Slot) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*4)
}

func bytesSlots(b []byte) []Slot {
	if len(b) < 4 {
		return []Slot{}
	}
	return unsafe.Slice((*Slot)(unsafe.Pointer(&b[0])), len(b)/4)
}
