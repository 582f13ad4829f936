// Command switchyard is the one binary of Switchyard: router replicas,
// simulated workers, adapters for real engines, a whole local cluster, load generation and health checks.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/switchyard/switchyard/bench"
	"github.com/switchyard/switchyard/internal/app"
)

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"up", "start a local cluster: embedded etcd and NATS, router replicas, simulated workers", app.Up},
	{"router", "run one router replica against external etcd and NATS", app.Router},
	{"worker", "run one simulated inference engine", app.Worker},
	{"adapter", "front a real engine (vLLM, SGLang, any OpenAI server) as a worker", app.Adapter},
	{"bench", "replay traces against an OpenAI endpoint, or simulate a cluster (--sim)", bench.Main},
	{"keys", "API keys file helpers: hash a key (from stdin), generate a key", app.Keys},
	{"healthcheck", "probe a router's or worker's /readyz (for container health checks)", app.Healthcheck},
	{"version", "print the build version", func(_ context.Context, _ []string, out, _ io.Writer) error {
		_, err := fmt.Fprintln(out, app.Version())
		return err
	}},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		// The first signal starts a graceful stop (a router's lame duck
		// takes seconds); a second one gets the default behaviour and
		// ends the process at once.
		context.AfterFunc(ctx, stop)
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil, errors.Is(err, context.Canceled):
			return 0
		case errors.Is(err, app.ErrUsage):
			return 2
		default:
			fmt.Fprintf(stderr, "switchyard %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "switchyard: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: switchyard <command> [flags]")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'switchyard <command> -h' for a command's flags.")
}
