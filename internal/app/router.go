package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/switchyard/switchyard/internal/listflag"
	"github.com/switchyard/switchyard/metrics"
)

// Router is the `switchyard router` subcommand: one router replica against
// external etcd and NATS, configured by flags with SWITCHYARD_* environment
// fallbacks (see applyEnv).
func Router(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, level, help, err := parseSubcommand(routerFlags, args, stderr)
	if help || err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "router: %v\n", err)
		return ErrUsage
	}
	log := newLogger(stderr, level)
	defer func() { _ = log.Sync() }()
	return RunReplica(ctx, cfg, log.Named(cfg.ID), metrics.NewRegistry(), func(s *ReplicaStatus) {
		scheme := "http"
		if cfg.Frontend.TLS.Enabled() {
			scheme = "https"
		}
		_, _ = fmt.Fprintf(stdout, "router %s ready: OpenAI API %s://%s/v1\n", s.ID, scheme, s.HTTPAddr)
	})
}

// routerFlags is the router's flag set, bound to a default config; resolve
// turns the parsed flags into the replica's config (policy file read,
// shared fields copied). Each setting has one name: the parts' flags that
// the replica sets itself are not registered (see registerWithout).
func routerFlags() (*flag.FlagSet, func() (ReplicaConfig, zapcore.Level, error)) {
	cfg := DefaultReplicaConfig()
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	fs.StringVar(&cfg.ID, "id", cfg.ID, "replica id (etcd key, gossip node name)")
	fs.StringVar(&cfg.Cluster, "cluster", cfg.Cluster, "cluster name (etcd prefix and NATS subjects)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "listen address of the OpenAI API")
	fs.StringVar(&cfg.AdvertiseHTTP, "advertise-http", cfg.AdvertiseHTTP, "API address other replicas see (default: the bound address)")
	fs.Func("etcd-endpoints", "comma-separated etcd endpoints (default "+strings.Join(cfg.EtcdEndpoints, ",")+")", func(s string) error {
		cfg.EtcdEndpoints = listflag.Split(s)
		return nil
	})
	fs.StringVar(&cfg.NATSURL, "nats-url", cfg.NATSURL, "NATS URL")
	fs.StringVar(&cfg.WorkerType, "worker-type", cfg.WorkerType, "worker_type label of the admission metrics")
	fs.DurationVar(&cfg.PredictTTL, "predict-ttl", cfg.PredictTTL, "lifetime of a routing decision's predicted prefix on a worker that publishes KV events")
	fs.DurationVar(&cfg.PredictTTLNoEvents, "predict-ttl-no-events", cfg.PredictTTLNoEvents, "lifetime of a routing decision's predicted prefix on a worker registered without KV events")
	fs.DurationVar(&cfg.DrainDelay, "shutdown-drain-delay", cfg.DrainDelay, "lame duck: on SIGTERM fail /readyz, hand the classes off and keep serving this long before refusing new requests (then in-flight requests get -http.shutdown-grace)")
	fs.DurationVar(&cfg.ShutdownLinger, "shutdown-linger", cfg.ShutdownLinger, "after handing classes off and exporting final counters, keep serving /metrics this long before exiting")
	fs.DurationVar(&cfg.Admission.EtcdDegradedAfter, "etcd-degraded-after", cfg.Admission.EtcdDegradedAfter, "while this router's etcd session is unhealthy, a request that found no owner for this long is admitted by the router's own scheduler (degraded mode)")
	fs.DurationVar(&cfg.Admission.OwnerUnreachableAfter, "nats-unreachable-after", cfg.Admission.OwnerUnreachableAfter, "a router cut from NATS this long withdraws from class placement (its classes move; it claims none until NATS is back), and a class whose owner answers no responders this long is admitted by the entry router's own scheduler")
	fs.DurationVar(&cfg.Admission.StatusAfter, "admit-status-after", cfg.Admission.StatusAfter, "an admit request sent to another router with no answer this long is probed at that router (queued: keep waiting; granted: use the grant its lost reply carried; unknown: resubmit), and again every this long")
	fs.DurationVar(&cfg.Admission.AdoptHold, "adopt-hold", cfg.Admission.AdoptHold, "after acquiring a class, hold its tenants' requests that have a concurrency quota this long so they count the streams the entries re-home to it (0: off)")
	fs.DurationVar(&cfg.Admission.BucketSyncInterval, "bucket-sync-interval", cfg.Admission.BucketSyncInterval, "how often a class owner saves its tenants' token-bucket levels to etcd so they move with the class (a crash loses at most this much)")
	var policyFile string
	fs.StringVar(&policyFile, "policy", "", "policy classes YAML seeded into etcd when it has none (docs/policy.md; default: the built-in policy)")
	// -http-addr is the API listener: the frontend's own address is unused.
	registerWithout(fs, func(fs *flag.FlagSet) { cfg.Frontend.RegisterFlags(fs, "http.") }, "http.addr")
	cfg.Scheduler.RegisterFlags(fs, "sched.")
	cfg.Index.RegisterFlags(fs, "index.")
	// The gossip node name is -id.
	registerWithout(fs, func(fs *flag.FlagSet) { cfg.Gossip.RegisterFlags(fs, "gossip.") }, "gossip.node-name")
	// A replica pushes its snapshots every -gossip.interval: nothing polls.
	registerWithout(fs, func(fs *flag.FlagSet) { cfg.Exporter.RegisterFlags(fs, "metrics.") }, "metrics.refresh-interval")
	fs.DurationVar(&cfg.Session.TTL, "session-ttl", cfg.Session.TTL, "etcd session lease TTL")
	cfg.Ownership.RegisterFlags(fs, "")
	// The ingest's cluster is -cluster.
	registerWithout(fs, func(fs *flag.FlagSet) { cfg.Ingest.RegisterFlags(fs, "ingest.") }, "ingest.cluster")
	cfg.Prompt.RegisterFlags(fs, "tokenizer.")
	cfg.Links.Etcd.RegisterFlags(fs, "etcd.")
	cfg.Links.NATS.RegisterFlags(fs, "nats.")
	cfg.Tenants.RegisterFlags(fs, "auth.")
	level := zapcore.InfoLevel
	fs.Var(flagLevel{&level}, "log-level", "log level (debug, info, warn, error)")
	resolve := func() (ReplicaConfig, zapcore.Level, error) {
		c := cfg
		if policyFile != "" {
			raw, err := os.ReadFile(policyFile)
			if err != nil {
				return c, level, fmt.Errorf("policy: %w", err)
			}
			c.PolicyYAML = raw
		}
		c.Frontend.Addr = c.HTTPAddr
		c.normalize()
		return c, level, nil
	}
	return fs, resolve
}

// parseFlags parses args, then fills every flag not given on the command
// line from its SWITCHYARD_* environment variable. It returns flag.ErrHelp
// for -h and ErrUsage (after printing why) for bad input.
// parseSubcommand builds a subcommand's flags (flags: routerFlags,
// upFlags), parses args into them and resolves the configuration. help is
// true, with a nil error, when -h printed the usage and nothing should run.
func parseSubcommand[C any](flags func() (*flag.FlagSet, func() (C, zapcore.Level, error)), args []string, stderr io.Writer) (cfg C, level zapcore.Level, help bool, err error) {
	fs, resolve := flags()
	fs.SetOutput(stderr)
	if err := parseFlags(fs, args, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, level, true, nil
		}
		return cfg, level, false, err
	}
	cfg, level, err = resolve()
	return cfg, level, false, err
}

func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	if err := checkRemovedFlags(fs, args, stderr); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
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

// newLogger is the JSON logger of every subcommand.
func newLogger(w io.Writer, level zapcore.Level) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), level))
}
