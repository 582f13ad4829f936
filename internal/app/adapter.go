package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/metrics"
)

// Adapter is the `switchyard adapter` subcommand: one process beside one
// real engine (vLLM, SGLang or any OpenAI-compatible server) that registers
// it, mirrors its KV cache to routers and reports its load (design §14).
// Flags have SWITCHYARD_* environment fallbacks (applyEnv).
func Adapter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := adapter.DefaultConfig()
	fs := flag.NewFlagSet("adapter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.RegisterFlags(fs, "")
	level := zapcore.InfoLevel
	fs.Var(flagLevel{&level}, "log-level", "log level (debug, info, warn, error)")
	if err := parseFlags(fs, args, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := cfg.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "adapter: %v\n", err)
		return ErrUsage
	}
	log := newLogger(stderr, level)
	defer func() { _ = log.Sync() }()
	return RunAdapter(ctx, cfg, log, func(url string) {
		_, _ = fmt.Fprintf(stdout, "adapter %s fronting %s engine %s; serving %s\n", cfg.ID, cfg.Engine, cfg.EngineURL, url)
	})
}

// RunAdapter connects to etcd and NATS and runs one adapter until ctx ends.
// ready, if non-nil, is called with the adapter's HTTP base URL once it
// serves.
func RunAdapter(ctx context.Context, cfg adapter.Config, log *zap.Logger, ready func(url string)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	etcd, err := clientv3.New(clientv3.Config{Endpoints: cfg.EtcdEndpoints, DialTimeout: 5 * time.Second, Logger: quietEtcdLogger(log)})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer etcd.Close()
	// The adapter outlives NATS outages; routers repair the gaps from dumps.
	nc, err := nats.Connect(cfg.NATSURL, nats.Name("switchyard-adapter-"+cfg.ID), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	reg := metrics.NewRegistry()
	a, err := adapter.New(cfg, adapter.Deps{Etcd: etcd, NATS: nc, Logger: log, Registerer: reg, Gatherer: reg, Ready: ready})
	if err != nil {
		return err
	}
	err = a.Run(ctx)
	if ferr := nc.Flush(); ferr != nil {
		log.Debug("nats flush at shutdown", zap.Error(ferr))
	}
	return err
}
