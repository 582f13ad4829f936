package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/switchyard/switchyard/metrics"
)

// registerReplicaFlags binds every field of cfg to fs. Flags also read
// SWITCHYARD_<NAME> from the environment (dots and dashes become
// underscores) when not given on the command line.
func registerReplicaFlags(fs *flag.FlagSet, cfg *ReplicaConfig, policyFile *string) {
	fs.StringVar(&cfg.ID, "id", cfg.ID, "replica id: unique in the cluster, [A-Za-z0-9_-]")
	fs.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, "cluster name (etcd prefix and NATS subject tree)")
	fs.StringVar(&cfg.HTTPAddr, "listen", cfg.HTTPAddr, "listen address of the OpenAI API, /metrics and /debug/cluster")
	fs.StringVar(&cfg.AdvertiseHTTP, "advertise", cfg.AdvertiseHTTP, "host:port other replicas and operators see (default: the bound address)")
	fs.Func("etcd", "comma-separated etcd endpoints (default http://127.0.0.1:2379)", func(s string) error {
		cfg.EtcdEndpoints = splitList(s)
		return nil
	})
	fs.StringVar(&cfg.NATSURL, "nats", cfg.NATSURL, "NATS URL")
	fs.StringVar(policyFile, "policy", "", "policy classes YAML (docs/policy.md); seeds etcd when the cluster has none (default: deploy/policy.yaml, built in)")
	fs.StringVar(&cfg.Model, "model-label", cfg.Model, "model label of the admission counters")
	fs.DurationVar(&cfg.PredictTTL, "predict-ttl", cfg.PredictTTL, "lifetime of a routing decision's predicted prefix")
	cfg.Session.RegisterFlags(fs, "etcd.")
	cfg.Ownership.RegisterFlags(fs, "")
	cfg.Gossip.RegisterFlags(fs, "gossip.")
	cfg.Scheduler.RegisterFlags(fs, "scheduler.")
	cfg.Index.RegisterFlags(fs, "index.")
	cfg.Ingest.RegisterFlags(fs, "ingest.")
	cfg.Frontend.RegisterFlags(fs, "http.")
	cfg.Exporter.RegisterFlags(fs, "metrics.")
}

// parseFlags parses args, then the environment, and reports usage errors.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return flag.ErrHelp
		}
		return ErrUsage
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := applyEnv(fs, set); err != nil {
		_, _ = fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return ErrUsage
	}
	return nil
}

func newLogger(w io.Writer, level zapcore.Level) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), level))
}

// Router is the `switchyard router` subcommand: one replica against
// external etcd and NATS.
func Router(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := DefaultReplicaConfig()
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var policyFile string
	registerReplicaFlags(fs, &cfg, &policyFile)
	level := zapcore.InfoLevel
	fs.Var(flagLevel{&level}, "log-level", "log level (debug, info, warn, error)")
	if err := parseFlags(fs, args, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if policyFile != "" {
		raw, err := os.ReadFile(policyFile)
		if err != nil {
			return fmt.Errorf("policy: %w", err)
		}
		cfg.PolicyYAML = raw
	}
	log := newLogger(stderr, level)
	defer func() { _ = log.Sync() }()
	reg := metrics.NewRegistry()
	return RunReplica(ctx, cfg, log, reg, func(s *ReplicaStatus) {
		_, _ = fmt.Fprintf(stdout, "router %s serving the OpenAI API at http://%s (gossip %s)\n", s.ID, s.HTTPAddr, s.GossipAddr)
	})
}

var _ prometheus.Registerer = (*prometheus.Registry)(nil)
