package app

import (
	"fmt"

	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/links"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

// Links are a process's security settings for etcd and NATS (-etcd.*,
// -nats.*; docs/security.md). The zero value is plaintext without
// credentials, as before.
type Links struct {
	Etcd links.Etcd
	NATS links.NATS
}

// Validate names the first bad field.
func (l Links) Validate() error {
	if err := l.Etcd.Validate("etcd."); err != nil {
		return err
	}
	return l.NATS.Validate("nats.")
}

// dialEtcd is the etcd client of every process.
func (l Links) dialEtcd(endpoints []string, log *zap.Logger, m *tlsconf.Metrics) (*clientv3.Client, error) {
	cfg, err := l.Etcd.ClientConfig(endpoints, quietEtcdLogger(log), tlsconf.Deps{Name: "etcd", Logger: log, Metrics: m})
	if err != nil {
		return nil, err
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return c, nil
}

// natsOptions are opts plus the TLS and credential options of the links.
func (l Links) natsOptions(url string, log *zap.Logger, m *tlsconf.Metrics, opts ...nats.Option) ([]nats.Option, error) {
	sec, err := l.NATS.Options(url, tlsconf.Deps{Name: "nats", Logger: log, Metrics: m})
	if err != nil {
		return nil, err
	}
	return append(opts, sec...), nil
}

// quietEtcdLogger is log for the etcd client, which is chatty at info: at
// least warn. (IncreaseLevel on a core that is already stricter fails.)
func quietEtcdLogger(log *zap.Logger) *zap.Logger {
	l := log.Named("etcd")
	if l.Core().Enabled(zap.InfoLevel) {
		l = l.WithOptions(zap.IncreaseLevel(zap.WarnLevel))
	}
	return l
}
