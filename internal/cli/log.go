package cli

import (
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
)

// isTerminal reports whether fd is a terminal.
func isTerminal(fd uintptr) bool {
	_, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
	return err == nil
}

// NewLogger returns a logger writing to stderr at level ("debug", "info",
// "warn", "error") in format ("console", "json", or "auto": console when
// stderr is a terminal, JSON otherwise).
func NewLogger(level, format string) (*zap.Logger, zap.AtomicLevel, error) {
	lvl, err := zap.ParseAtomicLevel(level)
	if err != nil {
		return nil, lvl, err
	}
	if format == "auto" {
		format = "json"
		if isTerminal(os.Stderr.Fd()) {
			format = "console"
		}
	}
	var cfg zap.Config
	switch format {
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		cfg.EncoderConfig.EncodeTime = zapcore.TimeEncoderOfLayout("15:04:05.000")
		cfg.Development = false
		cfg.DisableStacktrace = true
	default:
		cfg = zap.NewProductionConfig()
		cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
		cfg.Sampling = nil
	}
	cfg.Encoding = format
	cfg.Level = lvl
	cfg.OutputPaths = []string{"stderr"}
	cfg.ErrorOutputPaths = []string{"stderr"}
	// Stack traces are for bugs (DPanic and up), not for expected
	// conditions logged as errors (a pool out of reach, a lost page).
	cfg.DisableStacktrace = true
	log, err := cfg.Build(zap.AddStacktrace(zapcore.DPanicLevel))
	return log, lvl, err
}

func (a *App) setupLog() error {
	format, err := a.OneOf("log-format", "auto", "console", "json")
	if err != nil {
		return err
	}
	log, lvl, err := NewLogger(a.v.GetString("log-level"), format)
	if err != nil {
		return a.Invalid("log-level", "want debug, info, warn or error")
	}
	a.log, a.logLevel = log.Named(a.Name), lvl
	return nil
}
