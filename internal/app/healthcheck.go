package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"time"
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
// unless it answers 200 in time. Images built FROM scratch have no curl, so
// container health checks run this.
func Healthcheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:8080/readyz", "URL to probe")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return ErrUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck %s: %w", *url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck %s: status %d: %s", *url, resp.StatusCode, body)
	}
	_, _ = fmt.Fprintf(stdout, "ok %s\n", *url)
	return nil
}
