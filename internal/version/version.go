// Package version reports the build's version for the version commands and
// the daemons' startup logs. It is not for feature detection.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at build time with -ldflags "-X rmem/internal/version.Version=v1.2.3".
// When empty, the VCS revision recorded by the Go toolchain is used.
var Version string

// String returns a one-line description: version, revision, Go version, platform.
func String() string {
	v := Version
	rev, dirty := "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
	}
	if v == "" {
		v = "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		if dirty {
			rev += "-dirty"
		}
		v += " (" + rev + ")"
	}
	return fmt.Sprintf("%s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
