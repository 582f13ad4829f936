package main

import (
	"context"
	"io"
	"os"

	hc "github.com/switchyard/switchyard/internal/healthcheck"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" {
		os.Exit(healthcheck(os.Args[2:], os.Stdout, os.Stderr))
	}
	etcdmain.Main(os.Args)
}

// healthcheck probes http://127.0.0.1:2379/health (or --url): the container health check.
func healthcheck(args []string, stdout, stderr io.Writer) int {
	return hc.Main(context.Background(), args, "http://127.0.0.1:2379/health", stdout, stderr)
}
