package swaprun

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// procStat returns the state letter and the start time (clock ticks since
// boot) of process pid, from /proc/PID/stat.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseStat(b)
}

// parseStat decodes /proc/PID/stat: "pid (comm) S ppid ... starttime ...";
// comm may hold spaces and parentheses, so the fields start after the
// last ')'. starttime is field 22, the 20th after comm.
func parseStat(b []byte) (state byte, start uint64, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("swaprun: /proc/PID/stat: no ')' in %q", b)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("swaprun: /proc/PID/stat: short or bad %q", b)
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("swaprun: /proc/PID/stat: starttime: %w", err)
	}
	return f[0][0], start, nil
}

// alive reports whether process pid runs (a zombie does not) and, if start
// is not 0, is the process that started then rather than a later one
// given the same pid.
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	state, st, err := procStat(pid)
	if err != nil || state == 'Z' || state == 'X' {
		return false
	}
	return start == 0 || st == start
}

// startOf returns the start time of process pid, or 0 if unknown.
func startOf(pid int) uint64 {
	_, st, err := procStat(pid)
	if err != nil {
		return 0
	}
	return st
}
