package swaprun

import "rmem/procinfo"

// alive reports whether process pid runs (a zombie does not) and, if start
// is not 0, is the process that started then rather than a later one
// given the same pid.
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	s, err := procinfo.ReadStat(pid)
	if err != nil || s.Exited() {
		return false
	}
	return start == 0 || s.Start == start
}

// startOf returns the start time of process pid, or 0 if unknown.
func startOf(pid int) uint64 {
	s, err := procinfo.ReadStat(pid)
	if err != nil {
		return 0
	}
	return s.Start
}
