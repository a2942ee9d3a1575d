package traced

import (
	"debug/buildinfo"
	"debug/elf"
)

// Reach says why the shim cannot page the program at path, or "" when it
// can (a dynamically linked program that is not Go): "static" (no
// dynamic loader, so no LD_PRELOAD) or "go" (the Go runtime maps its heap
// with raw system calls, which no preloaded library sees). A file that is
// not an ELF executable gives "": the shim's way is tried.
func Reach(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return ""
	}
	interp := false
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp = true
		}
	}
	if !interp {
		return "static"
	}
	if _, err := buildinfo.ReadFile(path); err == nil {
		return "go"
	}
	return ""
}
