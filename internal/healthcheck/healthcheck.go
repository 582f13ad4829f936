// Package healthcheck is the HTTP probe behind the `healthcheck` subcommand
// of every Switchyard image (switchyard, and the etcd and NATS wrappers).
// Images built FROM scratch have no curl, so container health checks run
// the binary itself. It starts no goroutines.
package healthcheck

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/switchyard/switchyard/internal/tlsconf"
)

// Probe fails unless url answers 200 within timeout.
func Probe(ctx context.Context, url string, timeout time.Duration) error {
	return probe(ctx, http.DefaultClient, url, timeout)
}

func probe(ctx context.Context, client *http.Client, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck %s: status %d: %s", url, resp.StatusCode, body)
	}
	return nil
}

// Main parses `--url` (default defaultURL) and `--timeout`, probes, and
// returns the exit status: 0 healthy, 1 unhealthy, 2 bad flags.
func Main(ctx context.Context, args []string, defaultURL string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", defaultURL, "URL to probe")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	var tc tlsconf.ClientConfig
	tc.RegisterFlags(fs, "", "the probed server (https:// URLs)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	client := http.DefaultClient
	if tc.Enabled() {
		c, err := tc.Build(tlsconf.Deps{})
		if err != nil {
			_, _ = fmt.Fprintln(stderr, err)
			return 2
		}
		tr := &http.Transport{TLSClientConfig: c}
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr}
	}
	if err := probe(ctx, client, *url, *timeout); err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 1
	}
	_, _ = fmt.Fprintf(stdout, "ok %s\n", *url)
	return 0
}
