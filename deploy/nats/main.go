package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(serve(os.Args[1:], os.Stderr))
}

func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("nats-server", flag.ExitOnError)
	opts, err := server.ConfigureOptions(fs, args, server.PrintServerAndExit, fs.Usage, server.PrintTLSHelpAndDie)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "nats-server: %v\n", err)
		if errors.Is(err, server.ErrConfigReloadNotSupported) {
			return 3
		}
		return 1
	}
	s, err := server.NewServer(opts)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "nats-server: %v\n", err)
		return 1
	}
	s.ConfigureLogger()
	// server.Run starts the server and installs its signal handlers (SIGTERM,
	// SIGINT: shut down; SIGHUP: reload), as the upstream binary does.
	if err := server.Run(s); err != nil {
		_, _ = fmt.Fprintf(stderr, "nats-server: %v\n", err)
		return 1
	}
	s.WaitForShutdown()
	return 0
}

func healthcheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "http://127.0.0.1:8222/healthz", "URL to probe")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := probe(*url, *timeout); err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 1
	}
	_, _ = fmt.Fprintf(stdout, "ok %s\n", *url)
	return 0
}

func probe(url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
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
