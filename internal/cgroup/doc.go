// Package cgroup creates, limits, fills and removes memory cgroups: v2
// where the memory controller is enabled in the unified hierarchy, v1
// (/sys/fs/cgroup/memory) otherwise, as on hosts whose v2 hierarchy at
// /sys/fs/cgroup/unified has no memory controller.
//
// A Group's limit is on the memory its processes may keep resident
// (memory.limit_in_bytes in v1, memory.max in v2); what they use beyond it
// is reclaimed, to swap for anonymous memory.
//
// It is NOT a general cgroup library (no CPU, I/O or pids controllers,
// no delegation) and does not start processes: callers start the process
// and put it in the group with Attach, or start it through Exec.
package cgroup
