package traced

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestStubBytes assembles testdata/stub_amd64.S and compares it with stub.
func TestStubBytes(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc to assemble testdata/stub_amd64.S")
	}
	if _, err := exec.LookPath("objcopy"); err != nil {
		t.Skip("no objcopy")
	}
	dir := t.TempDir()
	obj, bin := filepath.Join(dir, "stub.o"), filepath.Join(dir, "stub.bin")
	if out, err := exec.Command("gcc", "-c", "-o", obj, "testdata/stub_amd64.S").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	if out, err := exec.Command("objcopy", "-O", "binary", "-j", ".text", obj, bin).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, out)
	}
	got, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, stub) || len(stub) != stubCode {
		t.Fatalf("stub is not testdata/stub_amd64.S assembled:\n got % x\nwant % x", stub, got)
	}
}
