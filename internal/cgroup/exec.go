package cgroup

import "os/exec"

// Command returns a command that runs name with args inside the group from
// its first instruction: a /bin/sh writes its own pid into cgroup.procs and
// then execs name, keeping that pid, so the exit status and signals of the
// command are those of the returned process. It works the same in v1 and
// v2 (CLONE_INTO_CGROUP would be v2 only).
func (g *Group) Command(name string, args ...string) *exec.Cmd {
	sh := []string{"-c", `echo $$ > "$0" && exec "$@"`, g.ProcsFile(), name}
	return exec.Command("/bin/sh", append(sh, args...)...)
}
