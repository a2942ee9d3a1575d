package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.uber.org/zap"

	"rmem/internal/version"
)

// App is one binary's command line: its root command, its configuration and
// its logger. Values are read through App so that an invalid one is reported
// with its key and its source (flag, environment variable or config file).
type App struct {
	Name      string // binary name, e.g. "memd"
	EnvPrefix string // e.g. "MEMD": the flag --local-mem is MEMD_LOCAL_MEM

	v          *viper.Viper
	cmd        *cobra.Command // the command being run
	configFile string         // the config file read, if any
	fileKeys   map[string]bool
	log        *zap.Logger
	logLevel   zap.AtomicLevel
}

// DefaultConfigDir is where a daemon looks for NAME.yaml when no --config is given.
const DefaultConfigDir = "/etc/rmem"

// NewApp returns an App whose root command is root. It adds the persistent
// flags --config, --log-level and --log-format and the version command, and
// loads the configuration before any command runs.
func NewApp(name, envPrefix string, root *cobra.Command) *App {
	a := &App{Name: name, EnvPrefix: envPrefix, v: viper.New(), log: zap.NewNop()}
	pf := root.PersistentFlags()
	pf.String("config", "", fmt.Sprintf("config file (YAML); default %s/%s.yaml if it exists (env %s_CONFIG)", DefaultConfigDir, name, envPrefix))
	pf.String("log-level", "info", "log level: debug, info, warn or error")
	pf.String("log-format", "auto", "log format: console, json, or auto (console on a terminal, JSON otherwise)")
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return a.load(cmd) }
	// --version as well as the version command: what packages and
	// operators try first.
	root.Version = version.String()
	root.SetVersionTemplate(name + " {{.Version}}\n")
	root.AddCommand(&cobra.Command{
		Use:    "man DIR",
		Short:  "Write the man pages of every command into DIR (make deb does)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			return doc.GenManTree(root, &doc.GenManHeader{Title: strings.ToUpper(name), Section: "1", Source: "rmem " + version.String()}, args[0])
		},
	})
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", name, version.String())
			return err
		},
	})
	return a
}

// Log returns the logger configured by --log-level and --log-format.
func (a *App) Log() *zap.Logger { return a.log }

// Command returns the command being run.
func (a *App) Command() *cobra.Command { return a.cmd }

// ConfigFile returns the path of the config file that was read, or "".
func (a *App) ConfigFile() string { return a.configFile }

// load reads the configuration for cmd. Precedence, lowest first: flag
// defaults, config file, environment, flags set on the command line.
func (a *App) load(cmd *cobra.Command) error {
	a.cmd = cmd
	v := a.v
	v.SetEnvPrefix(a.EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_", ".", "_"))
	v.AutomaticEnv()
	for _, fs := range []*pflag.FlagSet{cmd.Flags(), cmd.InheritedFlags()} {
		if err := v.BindPFlags(fs); err != nil {
			return err
		}
	}
	known := a.knownKeys(cmd.Root())
	if err := a.checkEnv(known); err != nil {
		return err
	}
	if err := a.readConfig(known); err != nil {
		return err
	}
	return a.setupLog()
}

func (a *App) knownKeys(root *cobra.Command) map[string]bool {
	known := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { known[f.Name] = true })
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) { known[f.Name] = true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	delete(known, "help")
	return known
}

func (a *App) envName(key string) string {
	return a.EnvPrefix + "_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(key))
}

// checkEnv rejects PREFIX_* variables that name no setting: a misspelt
// variable would otherwise be silently ignored.
func (a *App) checkEnv(known map[string]bool) error {
	byEnv := map[string]bool{}
	for k := range known {
		byEnv[a.envName(k)] = true
	}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, a.EnvPrefix+"_") && !byEnv[name] {
			return fmt.Errorf("environment variable %s names no %s setting (known: %s)", name, a.Name, a.listKnown(known, true))
		}
	}
	return nil
}

func (a *App) listKnown(known map[string]bool, env bool) string {
	names := make([]string, 0, len(known))
	for k := range known {
		if env {
			k = a.envName(k)
		}
		names = append(names, k)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func (a *App) readConfig(known map[string]bool) error {
	path := a.v.GetString("config")
	explicit := path != ""
	if !explicit {
		path = DefaultConfigDir + "/" + a.Name + ".yaml"
		if _, err := os.Stat(path); err != nil {
			return nil
		}
	}
	fv := viper.New()
	fv.SetConfigFile(path)
	fv.SetConfigType("yaml")
	if err := fv.ReadInConfig(); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	a.fileKeys = map[string]bool{}
	for _, k := range fv.AllKeys() {
		if !known[k] || k == "config" {
			return fmt.Errorf("config file %s: unknown key %q (known keys: %s)", path, k, a.listKnown(known, false))
		}
		a.fileKeys[k] = true
	}
	if err := a.v.MergeConfigMap(fv.AllSettings()); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	a.configFile = path
	return nil
}

// Source says where the value of key comes from, for error messages.
func (a *App) Source(key string) string {
	if a.cmd != nil {
		if f := a.cmd.Flags().Lookup(key); f != nil && f.Changed {
			return "flag --" + key
		}
	}
	if _, ok := os.LookupEnv(a.envName(key)); ok {
		return "environment variable " + a.envName(key)
	}
	if a.fileKeys[key] {
		return fmt.Sprintf("key %q in %s", key, a.configFile)
	}
	return "default of --" + key
}

// ErrInvalid is wrapped by every error about a bad configuration value.
var ErrInvalid = errors.New("invalid configuration")

// Invalid returns an error about the value of key that names the key and its source.
func (a *App) Invalid(key, format string, args ...any) error {
	return fmt.Errorf("%w: %s (%s = %q): %s", ErrInvalid, key, a.Source(key), a.v.GetString(key), fmt.Sprintf(format, args...))
}

// String returns the value of key.
func (a *App) String(key string) string { return a.v.GetString(key) }

// IsSet reports whether key was given by a flag, the environment or the config file.
func (a *App) IsSet(key string) bool { return !strings.HasPrefix(a.Source(key), "default") }

// Size returns key as a byte count.
func (a *App) Size(key string) (Size, error) {
	s, err := ParseSize(a.v.GetString(key))
	if err != nil {
		return 0, a.Invalid(key, "%v", err)
	}
	return s, nil
}

// Duration returns key as a duration ("500ms", "10s").
func (a *App) Duration(key string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(a.v.GetString(key)))
	if err != nil {
		return 0, a.Invalid(key, "want a duration such as 500ms, 10s or 2m")
	}
	if d < 0 {
		return 0, a.Invalid(key, "must not be negative")
	}
	return d, nil
}

// SpinFlag is the help text of a --spin flag.
const SpinFlag = "how long a thread waiting for the next fault, reply or request polls before it blocks, adapted to how fast they come; saves a wake-up of a halted vCPU (tens of µs on VMs) per event for at most this much CPU after each; 0: never poll"

// Spin returns a --spin flag as an option of rdma and pager: the duration,
// or -1 for 0 (never); at most 10ms.
func (a *App) Spin(key string) (time.Duration, error) {
	d, err := a.Duration(key)
	switch {
	case err != nil:
		return 0, err
	case d > 10*time.Millisecond:
		return 0, a.Invalid(key, "at most 10ms (a spin longer than a scheduler tick only burns CPU)")
	case d == 0:
		return -1, nil
	}
	return d, nil
}

// Int returns key as an integer within [min, max].
func (a *App) Int(key string, min, max int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(a.v.GetString(key)))
	if err != nil {
		return 0, a.Invalid(key, "want an integer")
	}
	if n < min || n > max {
		return 0, a.Invalid(key, "must be between %d and %d", min, max)
	}
	return n, nil
}

// Bool returns key as a boolean.
func (a *App) Bool(key string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(a.v.GetString(key)))
	if err != nil {
		return false, a.Invalid(key, "want true or false")
	}
	return b, nil
}

// OneOf returns key, which must be one of choices.
func (a *App) OneOf(key string, choices ...string) (string, error) {
	s := strings.TrimSpace(a.v.GetString(key))
	for _, c := range choices {
		if s == c {
			return s, nil
		}
	}
	return "", a.Invalid(key, "want one of %s", strings.Join(choices, ", "))
}

// StringSlice returns key as a list (a comma-separated string in a flag or
// the environment, a list in the config file).
func (a *App) StringSlice(key string) []string {
	var out []string
	for _, s := range a.v.GetStringSlice(key) {
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// Stdout returns where a command writes its normal output.
func (a *App) Stdout() io.Writer {
	if a.cmd != nil {
		return a.cmd.OutOrStdout()
	}
	return os.Stdout
}
