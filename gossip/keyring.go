package gossip

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"
)

// Keys are the gossip encryption keys of a member: Primary encrypts what it
// sends; Primary and every key of Others decrypt what it receives. That is
// what makes rotation possible without downtime (docs/security.md): install
// the new key everywhere as an other key, make it primary everywhere, then
// remove the old one everywhere. At every step each member can decrypt what
// every other member sends.
type Keys struct {
	Primary []byte
	Others  [][]byte
}

// ParseKeyring reads a keyring file: one base64 key (16, 24 or 32 bytes)
// per line, the first line the primary. Blank lines and lines starting
// with # are ignored; a key listed twice counts once.
func ParseKeyring(b []byte) (Keys, error) {
	var k Keys
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return Keys{}, fmt.Errorf("%w: line %d is not base64", ErrInvalidKeyring, i+1)
		}
		if err := checkKey(key); err != nil {
			return Keys{}, fmt.Errorf("%w: line %d: %w", ErrInvalidKeyring, i+1, err)
		}
		switch {
		case k.Primary == nil:
			k.Primary = key
		case bytes.Equal(key, k.Primary) || slices.ContainsFunc(k.Others, func(o []byte) bool { return bytes.Equal(o, key) }):
		default:
			k.Others = append(k.Others, key)
		}
	}
	if k.Primary == nil {
		return Keys{}, fmt.Errorf("%w: no key", ErrInvalidKeyring)
	}
	return k, nil
}

func checkKey(k []byte) error {
	switch len(k) {
	case 16, 24, 32:
		return nil
	}
	return fmt.Errorf("%d bytes; want 16, 24 or 32", len(k))
}

// newKeyring is memberlist's keyring for the config's keys: the keyring
// file's, else SecretKey alone, else nil (no encryption).
func newKeyring(cfg Config) (*memberlist.Keyring, error) {
	k := Keys{Primary: cfg.SecretKey}
	if cfg.KeyringFile != "" {
		b, err := os.ReadFile(cfg.KeyringFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidKeyring, err)
		}
		if k, err = ParseKeyring(b); err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.KeyringFile, err)
		}
	}
	if len(k.Primary) == 0 {
		return nil, nil
	}
	return memberlist.NewKeyring(k.Others, k.Primary)
}

// SetKeys installs keys in the running keyring: new keys are added, the
// primary switched, and keys not listed removed, in that order, so nothing
// a member with the old or the new set sends is dropped in between. It
// fails with ErrNoEncryption when the member started without a key
// (turning encryption on or off takes a restart of every member).
func (g *Gossip) SetKeys(k Keys) error {
	if g.keyring == nil {
		return ErrNoEncryption
	}
	if err := checkKey(k.Primary); err != nil {
		return fmt.Errorf("%w: primary: %w", ErrInvalidKeyring, err)
	}
	for i, o := range k.Others {
		if err := checkKey(o); err != nil {
			return fmt.Errorf("%w: other key %d: %w", ErrInvalidKeyring, i, err)
		}
	}
	want := append([][]byte{k.Primary}, k.Others...)
	for _, key := range want {
		if err := g.keyring.AddKey(key); err != nil {
			return fmt.Errorf("gossip keyring: add: %w", err)
		}
	}
	if err := g.keyring.UseKey(k.Primary); err != nil {
		return fmt.Errorf("gossip keyring: use: %w", err)
	}
	for _, have := range g.keyring.GetKeys() {
		if !slices.ContainsFunc(want, func(w []byte) bool { return bytes.Equal(w, have) }) {
			if err := g.keyring.RemoveKey(have); err != nil {
				return fmt.Errorf("gossip keyring: remove: %w", err)
			}
		}
	}
	return nil
}

// CurrentKeys is the keyring as installed now (nil Primary: no encryption).
func (g *Gossip) CurrentKeys() Keys {
	if g.keyring == nil {
		return Keys{}
	}
	k := Keys{Primary: g.keyring.GetPrimaryKey()}
	for _, key := range g.keyring.GetKeys() {
		if !bytes.Equal(key, k.Primary) {
			k.Others = append(k.Others, key)
		}
	}
	return k
}

// keyringMetrics counts keyring file reloads.
type keyringMetrics struct {
	reloads *prometheus.CounterVec
}

func newKeyringMetrics(reg prometheus.Registerer) keyringMetrics {
	m := keyringMetrics{reloads: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_gossip_keyring_reloads_total",
		Help: "Changes of the gossip keyring file seen, by result (applied; failed: the installed keys stay).",
	}, []string{"result"})}
	m.reloads.WithLabelValues("applied")
	m.reloads.WithLabelValues("failed")
	return m
}

// watchKeyring re-reads the keyring file every KeyringCheckInterval and
// installs it when its contents change, until ctx ends. A file that does
// not parse keeps the installed keys (counted, logged once per content).
func (g *Gossip) watchKeyring(ctx context.Context) {
	last, _ := os.ReadFile(g.cfg.KeyringFile) // New parsed this content
	t := time.NewTicker(g.cfg.KeyringCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b, err := os.ReadFile(g.cfg.KeyringFile)
		if err == nil && bytes.Equal(b, last) {
			continue
		}
		if err == nil {
			last = b
			var k Keys
			if k, err = ParseKeyring(b); err == nil {
				err = g.SetKeys(k)
			}
		}
		if err != nil {
			g.km.reloads.WithLabelValues("failed").Inc()
			g.log.Warn("gossip keyring file not applied; the installed keys stay", zap.String("file", g.cfg.KeyringFile), zap.Error(err))
			if errors.Is(err, os.ErrNotExist) {
				last = nil
			}
			continue
		}
		g.km.reloads.WithLabelValues("applied").Inc()
		g.log.Info("gossip keyring applied", zap.String("file", g.cfg.KeyringFile), zap.Int("keys", len(g.keyring.GetKeys())))
	}
}
