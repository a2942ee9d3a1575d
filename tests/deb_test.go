package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"rmem/tests/internal/memdtest"
)

// TestDebPackage: scripts/deb.sh (make deb) packages the binaries with
// the shim beside memagent, the systemd units pointing at /usr/bin, man
// pages and completions generated from the commands, and the monitoring
// configs; the packaged binaries answer --version.
func TestDebPackage(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("no dpkg-deb (Debian's dpkg)")
	}
	maNeeds(t)
	bin := t.TempDir()
	ma := maBuild(t)
	for _, f := range [][2]string{{memdtest.Build(t), "memd"}, {filepath.Join(ma, "memagent"), "memagent"}, {filepath.Join(ma, "librmem.so"), "librmem.so"}} {
		if err := os.Symlink(f[0], filepath.Join(bin, f[1])); err != nil {
			t.Fatal(err)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("../scripts/deb.sh", out)
	cmd.Env = append(os.Environ(), "BIN="+bin, "DEB_VERSION=1.2.3", "DEB_COMPRESS=none")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/deb.sh: %v\n%s", err, b)
	}
	deb := strings.TrimSpace(string(b))
	if filepath.Base(deb) != "rmem_1.2.3_amd64.deb" {
		t.Fatalf("made %q, want rmem_1.2.3_amd64.deb", deb)
	}
	root := t.TempDir()
	if b, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x: %v\n%s", err, b)
	}
	for _, f := range []string{"usr/lib/rmem/librmem.so", "usr/share/man/man1/memagent-run.1.gz", "usr/share/man/man1/memd-serve.1.gz",
		"usr/share/bash-completion/completions/memagent.bash", "usr/share/zsh/vendor-completions/_memd",
		"usr/share/rmem/prometheus/rmem-alerts.yml", "usr/share/rmem/grafana/rmem-dashboard.json", "usr/share/doc/rmem/examples/memd.yaml"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("the package lacks %s", f)
		}
	}
	for _, u := range []string{"memd", "memagent"} {
		unit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system", u+".service"))
		if err != nil || !strings.Contains(string(unit), "ExecStart=/usr/bin/"+u+" serve") || strings.Contains(string(unit), "/usr/local") {
			t.Errorf("%s.service: %v\n%s", u, err, unit)
		}
		v, err := exec.Command(filepath.Join(root, "usr/bin", u), "--version").Output()
		if err != nil || !strings.HasPrefix(string(v), u+" ") {
			t.Errorf("the packaged %s --version: %q %v", u, v, err)
		}
	}
	info, err := exec.Command("dpkg-deb", "-f", deb, "Package", "Version", "Architecture", "Depends").Output()
	if err != nil || !strings.Contains(string(info), "Package: rmem\nVersion: 1.2.3\nArchitecture: amd64\n") {
		t.Errorf("control: %v\n%s", err, info)
	}
}
