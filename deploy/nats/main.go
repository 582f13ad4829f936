package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	hc "github.com/switchyard/switchyard/internal/healthcheck"

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

// healthcheck probes http://127.0.0.1:8222/healthz (or --url): the container health check.
func healthcheck(args []string, stdout, stderr io.Writer) int {
	return hc.Main(context.Background(), args, "http://127.0.0.1:8222/healthz", stdout, stderr)
}
