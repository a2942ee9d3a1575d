// Package cpuidle reads how this machine's idle CPUs wait, to tell when
// that makes remote faults slow: in a VM guest whose idle vCPUs halt at
// once (the haltpoll cpuidle driver with guest_halt_poll_ns 0, as on the
// Firecracker VMs these machines are), waking a thread on an idle vCPU
// goes through the hypervisor and costs tens of µs, and a remote fault
// wakes four threads (the agent's loop, the memory server, the loop again,
// the program).
//
// It is not a tuner: it reads sysfs and changes nothing. Raising
// guest_halt_poll_ns is the operator's call (an idle vCPU then spins that
// long before it halts, which the host counts as busy).
package cpuidle

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Policy is how idle CPUs wait.
type Policy struct {
	// Driver is the cpuidle driver ("haltpoll", "intel_idle",
	// "acpi_idle", "none"), or "" where sysfs does not say.
	Driver string
	// HaltPollNS is how long an idle vCPU polls before it halts
	// (haltpoll's guest_halt_poll_ns), or -1 where haltpoll does not run.
	HaltPollNS int64
}

// Read reads the policy from sysfs (normally "/sys"). A machine whose
// sysfs has no cpuidle is not an error: Driver is "" then.
func Read(sysfs string) (Policy, error) {
	p := Policy{HaltPollNS: -1}
	b, err := os.ReadFile(filepath.Join(sysfs, "devices/system/cpu/cpuidle/current_driver"))
	if err != nil {
		if os.IsNotExist(err) {
			return p, nil
		}
		return p, fmt.Errorf("cpuidle: %w", err)
	}
	p.Driver = strings.TrimSpace(string(b))
	if p.Driver != "haltpoll" {
		return p, nil
	}
	path := filepath.Join(sysfs, "module/haltpoll/parameters/guest_halt_poll_ns")
	if b, err = os.ReadFile(path); err != nil {
		return p, fmt.Errorf("cpuidle: %w", err)
	}
	if p.HaltPollNS, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return Policy{Driver: p.Driver, HaltPollNS: -1}, fmt.Errorf("cpuidle: %s: %w", path, err)
	}
	return p, nil
}

// SlowWakeups reports whether idle vCPUs halt without polling first.
func (p Policy) SlowWakeups() bool { return p.Driver == "haltpoll" && p.HaltPollNS == 0 }

// Advice says what SlowWakeups means and what to do, or "" when it is
// false.
func (p Policy) Advice() string {
	if !p.SlowWakeups() {
		return ""
	}
	return "idle vCPUs halt at once (cpuidle haltpoll, guest_halt_poll_ns 0): waking a thread on one costs tens of µs, " +
		"and a remote fault wakes four, so random-access programs page 2-3x slower than they could " +
		"(measured on such a VM: 100k random faults took 5.1 s, 1.9 s with polling); " +
		"to let idle vCPUs poll 200 µs before they halt: echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns"
}

// String describes the policy for logs and benchmark output.
func (p Policy) String() string {
	switch {
	case p.Driver == "":
		return "cpuidle unknown"
	case p.HaltPollNS >= 0:
		return fmt.Sprintf("cpuidle %s, guest_halt_poll_ns %d", p.Driver, p.HaltPollNS)
	default:
		return "cpuidle " + p.Driver
	}
}
