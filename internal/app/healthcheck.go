package app

import (
	"context"
	"errors"
	"io"
	"runtime/debug"

	"github.com/switchyard/switchyard/internal/healthcheck"
)

// ErrUsage is returned by a subcommand whose flags could not be parsed; the
// flag package has already printed what is wrong.
var ErrUsage = errors.New("usage")

// Version returns the module version and VCS revision baked into the binary.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "switchyard (unknown build)"
	}
	v := "switchyard " + bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			v += " " + s.Value
		}
	}
	return v + " " + bi.GoVersion
}

// Healthcheck probes a URL (default http://127.0.0.1:8080/readyz) and fails
// unless it answers 200 in time: the container health check of the
// switchyard image.
func Healthcheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	switch healthcheck.Main(ctx, args, "http://127.0.0.1:8080/readyz", stdout, stderr) {
	case 0:
		return nil
	case 2:
		return ErrUsage
	}
	return errors.New("unhealthy")
}
