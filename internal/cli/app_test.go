package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// newTestApp builds a small command tree: root with a "serve" command that
// has --capacity (a size) and --timeout (a duration).
func newTestApp(t *testing.T) (*App, *cobra.Command, *struct {
	cap  Size
	tout string
}) {
	t.Helper()
	got := &struct {
		cap  Size
		tout string
	}{}
	root := &cobra.Command{Use: "testd"}
	app := NewApp("testd", "TESTD", root)
	serve := &cobra.Command{
		Use: "serve",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := app.Size("capacity")
			if err != nil {
				return err
			}
			if _, err := app.Duration("timeout"); err != nil {
				return err
			}
			got.cap, got.tout = c, app.String("timeout")
			return nil
		},
	}
	serve.Flags().String("capacity", "1GiB", "")
	serve.Flags().String("timeout", "5s", "")
	root.AddCommand(serve)
	return app, root, got
}

func run(root *cobra.Command, args ...string) (string, error) {
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "testd.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrecedence(t *testing.T) {
	cfg := writeFile(t, "capacity: 2GiB\ntimeout: 7s\n")

	_, root, got := newTestApp(t)
	if _, err := run(root, "serve", "--config", cfg); err != nil {
		t.Fatal(err)
	}
	if got.cap != 2<<30 || got.tout != "7s" {
		t.Fatalf("from file: %v %v", got.cap, got.tout)
	}

	t.Setenv("TESTD_CAPACITY", "3GiB")
	_, root, got = newTestApp(t)
	if _, err := run(root, "serve", "--config", cfg); err != nil {
		t.Fatal(err)
	}
	if got.cap != 3<<30 {
		t.Fatalf("env should beat file: %v", got.cap)
	}

	_, root, got = newTestApp(t)
	if _, err := run(root, "serve", "--config", cfg, "--capacity", "4GiB"); err != nil {
		t.Fatal(err)
	}
	if got.cap != 4<<30 {
		t.Fatalf("flag should beat env: %v", got.cap)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		file string
		args []string
		want []string
	}{
		{name: "bad flag value", args: []string{"--capacity", "lots"}, want: []string{"capacity", "flag --capacity", "lots"}},
		{name: "bad env value", env: map[string]string{"TESTD_TIMEOUT": "soon"}, want: []string{"timeout", "TESTD_TIMEOUT", "duration"}},
		{name: "bad file value", file: "capacity: 12 parsecs\n", want: []string{"capacity", "testd.yaml", "parsecs"}},
		{name: "unknown file key", file: "capacty: 1GiB\n", want: []string{"unknown key", "capacty"}},
		{name: "unknown env var", env: map[string]string{"TESTD_CAPACTY": "1GiB"}, want: []string{"TESTD_CAPACTY", "names no testd setting"}},
		{name: "bad log level", args: []string{"--log-level", "chatty"}, want: []string{"log-level", "chatty"}},
		{name: "missing config", args: []string{"--config", "/nonexistent/testd.yaml"}, want: []string{"/nonexistent/testd.yaml"}},
		{name: "malformed yaml", file: "capacity: [1,\n", want: []string{"config file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			args := append([]string{"serve"}, tt.args...)
			if tt.file != "" {
				args = append(args, "--config", writeFile(t, tt.file))
			}
			_, root, _ := newTestApp(t)
			_, err := run(root, args...)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestInvalidIsSentinel(t *testing.T) {
	_, root, _ := newTestApp(t)
	_, err := run(root, "serve", "--capacity", "x")
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("%v is not ErrInvalid", err)
	}
}

func TestVersion(t *testing.T) {
	_, root, _ := newTestApp(t)
	out, err := run(root, "version")
	if err != nil || !strings.HasPrefix(out, "testd ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version: %q %v", out, err)
	}
	_, root, _ = newTestApp(t)
	flag, err := run(root, "--version")
	if err != nil || flag != out {
		t.Fatalf("--version: %q %v, want %q as the version command says", flag, err, out)
	}
}
