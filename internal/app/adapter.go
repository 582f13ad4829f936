package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/metrics"
)

// adapterFlags is the adapter's flag set, bound to a default config.
func adapterFlags() (*flag.FlagSet, *adapter.Config, *Links, *zapcore.Level) {
	cfg := adapter.DefaultConfig()
	fs := flag.NewFlagSet("adapter", flag.ContinueOnError)
	cfg.RegisterFlags(fs, "")
	var lk Links
	lk.Etcd.RegisterFlags(fs, "etcd.")
	lk.NATS.RegisterFlags(fs, "nats.")
	level := zapcore.InfoLevel
	fs.Var(flagLevel{&level}, "log-level", "log level (debug, info, warn, error)")
	return fs, &cfg, &lk, &level
}

// Adapter is the `switchyard adapter` subcommand: one process beside one
// real engine (vLLM, SGLang or any OpenAI-compatible server) that registers
// it, mirrors its KV cache to routers and reports its load (design §14).
// Flags have SWITCHYARD_* environment fallbacks (applyEnv).
func Adapter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cfgp, lkp, levelp := adapterFlags()
	fs.SetOutput(stderr)
	if err := parseFlags(fs, args, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg, lk, level := *cfgp, *lkp, *levelp
	if err := cfg.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "adapter: %v\n", err)
		return ErrUsage
	}
	if err := lk.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "adapter: %v\n", err)
		return ErrUsage
	}
	log := newLogger(stderr, level)
	defer func() { _ = log.Sync() }()
	return RunAdapterWithLinks(ctx, cfg, lk, log, func(url string) {
		_, _ = fmt.Fprintf(stdout, "adapter %s fronting %s engine %s; serving %s\n", cfg.ID, cfg.Engine, cfg.EngineURL, url)
	})
}

// RunAdapterWithLinks connects to etcd and NATS over lk's links and runs
// one adapter until ctx ends. ready, if non-nil, is called with the
// adapter's HTTP base URL once it serves.
func RunAdapterWithLinks(ctx context.Context, cfg adapter.Config, lk Links, log *zap.Logger, ready func(url string)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := lk.Validate(); err != nil {
		return err
	}
	reg := metrics.NewRegistry()
	tlsMetrics := tlsconf.NewMetrics(reg)
	etcd, err := lk.dialEtcd(cfg.EtcdEndpoints, log, tlsMetrics)
	if err != nil {
		return err
	}
	defer etcd.Close()
	// The adapter outlives NATS outages; routers repair the gaps from dumps.
	opts, err := lk.natsOptions(cfg.NATSURL, log, tlsMetrics, nats.Name("switchyard-adapter-"+cfg.ID), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return err
	}
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	a, err := adapter.New(cfg, adapter.Deps{Etcd: etcd, NATS: nc, Logger: log, Registerer: reg, Gatherer: reg,
		TLSMetrics: tlsMetrics, Ready: ready})
	if err != nil {
		return err
	}
	err = a.Run(ctx)
	if ferr := nc.Flush(); ferr != nil {
		log.Debug("nats flush at shutdown", zap.Error(ferr))
	}
	return err
}
