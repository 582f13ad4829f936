package gossip

import (
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/switchyard/switchyard/internal/listflag"
)

// Config configures one replica's gossip member. Defaults live in
// DefaultConfig; Validate names the first bad field.
type Config struct {
	// NodeName is the memberlist node name and the origin of everything this
	// replica authors. It must be unique in the cluster; the replica id.
	NodeName string
	// BindAddr and BindPort are where memberlist listens (UDP and TCP). Port
	// 0 picks a free port; Addr reports it once Ready is closed.
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what other members dial; empty/0
	// means the bound address.
	AdvertiseAddr string
	AdvertisePort int
	// Join lists host:port of existing members. Run keeps retrying every
	// JoinRetryInterval until one join succeeds.
	Join              []string
	JoinRetryInterval time.Duration
	// ClusterLabel is memberlist's Config.Label: packets and streams with
	// another label are dropped, so two clusters on one network stay apart.
	ClusterLabel string
	// SecretKey (16, 24 or 32 bytes: AES-128/192/256) encrypts and
	// authenticates all gossip. Empty disables encryption (logged).
	SecretKey []byte
	// KeyringFile, instead of SecretKey, names a file of base64 keys, one
	// per line, the first the primary (ParseKeyring). It is re-read every
	// KeyringCheckInterval and installed when it changes: the way to rotate
	// keys without downtime (Keys).
	KeyringFile          string
	KeyringCheckInterval time.Duration
	// RequireEncryption makes a member without SecretKey or KeyringFile
	// refuse to start (deploy manifests set it).
	RequireEncryption bool
	// Interval is how often local load changes are coalesced into
	// broadcasts, and how often departures and expiries are checked.
	Interval time.Duration
	// DigestInterval is how often KV index digests are re-read. Digests move
	// with every KV event, so sampling them less often than loads keeps them
	// from dominating bandwidth.
	DigestInterval time.Duration
	// GracePeriod is how long a departed (dead or left) replica's
	// contributions stay before they are removed.
	GracePeriod time.Duration
	// Memberlist tuning; see memberlist.Config for each.
	GossipInterval   time.Duration
	GossipNodes      int
	RetransmitMult   int
	PushPullInterval time.Duration
	ProbeInterval    time.Duration
	ProbeTimeout     time.Duration
	SuspicionMult    int
	// MaxMessageBytes bounds one gossip message; larger shards and
	// predictions are split. It must fit memberlist's UDP packet (1400 bytes)
	// with its headers, encryption and label, and hold the largest header
	// plus one entry (names are at most 128 bytes), hence [512, 1200].
	MaxMessageBytes int
	// InboxSize is how many decoded messages may wait for the owner
	// goroutine. memberlist delivers a whole packet's messages in a burst and
	// its callbacks must never block, so the inbox absorbs bursts; when it is
	// full, messages are dropped and counted
	// (switchyard_gossip_dropped_messages_total{reason="inbox_full"}) and the
	// next push-pull repairs the loss.
	InboxSize int
	// PredictionQueueSize is how many Predict calls may wait for the owner
	// goroutine. Predict never blocks the routing path; when the queue is
	// full the prediction is dropped and counted
	// (reason="prediction_queue_full"): it is a hint, the engine's own KV
	// events are the truth.
	PredictionQueueSize int
	// LeaveTimeout bounds the graceful leave broadcast when Run exits.
	LeaveTimeout time.Duration
	// SkipLeave makes Run shut memberlist down without the graceful leave,
	// so the others' failure detector has to notice: what a crash looks
	// like. Tests use it to kill a replica.
	SkipLeave bool
	// Meta is this replica's node meta. Meta.ReplicaID defaults to NodeName.
	Meta NodeMeta
}

// DefaultConfig returns the defaults: a 50 ms coalescing interval and
// gossip interval (the 500 ms convergence goal leaves room for a few hops),
// a 10 s grace period, push-pull anti-entropy every 10 s, and a retransmit
// multiplier of 6. With memberlist's usual 4, a relayed broadcast missed a
// given member about once in a thousand (each sender reaches 3 or 4 random
// peers), which then waited for push-pull; with 6, 1000 changes on 5
// replicas and 500 on 8 all converged without one.
func DefaultConfig() Config {
	return Config{
		BindAddr:             "0.0.0.0",
		BindPort:             7946,
		JoinRetryInterval:    time.Second,
		ClusterLabel:         "switchyard",
		Interval:             50 * time.Millisecond,
		DigestInterval:       time.Second,
		GracePeriod:          10 * time.Second,
		GossipInterval:       50 * time.Millisecond,
		GossipNodes:          3,
		RetransmitMult:       6,
		PushPullInterval:     10 * time.Second,
		ProbeInterval:        time.Second,
		ProbeTimeout:         500 * time.Millisecond,
		SuspicionMult:        4,
		MaxMessageBytes:      1024,
		InboxSize:            1024,
		PredictionQueueSize:  1024,
		LeaveTimeout:         2 * time.Second,
		KeyringCheckInterval: 5 * time.Second,
	}
}

// maxLabelLen is memberlist.LabelMaxSize.
const maxLabelLen = 255

// Validate reports the first invalid field.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.NodeName == "":
		return bad("NodeName", "must not be empty")
	case len(c.NodeName) > maxNameLen:
		return bad("NodeName", "longer than %d bytes", maxNameLen)
	case c.BindAddr == "":
		return bad("BindAddr", "must not be empty")
	case c.BindPort < 0 || c.BindPort > 65535:
		return bad("BindPort", "%d out of range", c.BindPort)
	case c.AdvertisePort < 0 || c.AdvertisePort > 65535:
		return bad("AdvertisePort", "%d out of range", c.AdvertisePort)
	case c.JoinRetryInterval <= 0:
		return bad("JoinRetryInterval", "must be positive")
	case len(c.ClusterLabel) > maxLabelLen:
		return bad("ClusterLabel", "longer than %d bytes", maxLabelLen)
	case len(c.SecretKey) != 0 && len(c.SecretKey) != 16 && len(c.SecretKey) != 24 && len(c.SecretKey) != 32:
		return bad("SecretKey", "%d bytes; want 16, 24 or 32", len(c.SecretKey))
	case len(c.SecretKey) != 0 && c.KeyringFile != "":
		return bad("KeyringFile", "set together with SecretKey; give one")
	case c.RequireEncryption && len(c.SecretKey) == 0 && c.KeyringFile == "":
		return bad("SecretKey", "empty, and encryption is required: give a secret key or a keyring file")
	case c.KeyringFile != "" && c.KeyringCheckInterval <= 0:
		return bad("KeyringCheckInterval", "must be positive")
	case c.Interval <= 0:
		return bad("Interval", "must be positive")
	case c.DigestInterval <= 0:
		return bad("DigestInterval", "must be positive")
	case c.GracePeriod <= 0:
		return bad("GracePeriod", "must be positive")
	case c.GossipInterval <= 0:
		return bad("GossipInterval", "must be positive")
	case c.GossipNodes <= 0:
		return bad("GossipNodes", "must be positive")
	case c.RetransmitMult <= 0:
		return bad("RetransmitMult", "must be positive")
	case c.PushPullInterval <= 0:
		return bad("PushPullInterval", "must be positive")
	case c.ProbeInterval <= 0:
		return bad("ProbeInterval", "must be positive")
	case c.ProbeTimeout <= 0 || c.ProbeTimeout > c.ProbeInterval:
		return bad("ProbeTimeout", "must be positive and at most ProbeInterval")
	case c.SuspicionMult <= 0:
		return bad("SuspicionMult", "must be positive")
	case c.MaxMessageBytes < 512 || c.MaxMessageBytes > 1200:
		return bad("MaxMessageBytes", "%d not in [512, 1200]", c.MaxMessageBytes)
	case c.InboxSize <= 0:
		return bad("InboxSize", "must be positive")
	case c.PredictionQueueSize <= 0:
		return bad("PredictionQueueSize", "must be positive")
	case c.LeaveTimeout <= 0:
		return bad("LeaveTimeout", "must be positive")
	case c.Meta.ReplicaID != "" && c.Meta.ReplicaID != c.NodeName:
		return bad("Meta.ReplicaID", "%q differs from NodeName %q", c.Meta.ReplicaID, c.NodeName)
	}
	for i, j := range c.Join {
		if j == "" {
			return bad(fmt.Sprintf("Join[%d]", i), "empty address")
		}
	}
	if _, err := EncodeNodeMeta(c.meta()); err != nil {
		return bad("Meta", "%v", err)
	}
	return nil
}

// meta is the node meta with ReplicaID defaulted to NodeName.
func (c Config) meta() NodeMeta {
	m := c.Meta
	if m.ReplicaID == "" {
		m.ReplicaID = c.NodeName
	}
	return m
}

// RegisterFlags registers the config's flags under prefix (for example
// "gossip."), with the receiver's current values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.NodeName, prefix+"node-name", c.NodeName, "gossip node name (the replica id)")
	fs.StringVar(&c.BindAddr, prefix+"bind-addr", c.BindAddr, "gossip bind address")
	fs.IntVar(&c.BindPort, prefix+"bind-port", c.BindPort, "gossip bind port (0: any free port)")
	fs.StringVar(&c.AdvertiseAddr, prefix+"advertise-addr", c.AdvertiseAddr, "gossip address other replicas dial (default: bound address)")
	fs.IntVar(&c.AdvertisePort, prefix+"advertise-port", c.AdvertisePort, "gossip port other replicas dial (default: bound port)")
	fs.Func(prefix+"join", "comma-separated host:port of gossip members to join", func(s string) error {
		c.Join = listflag.Split(s)
		return nil
	})
	fs.DurationVar(&c.JoinRetryInterval, prefix+"join-retry-interval", c.JoinRetryInterval, "interval between join attempts until one succeeds")
	fs.StringVar(&c.ClusterLabel, prefix+"cluster-label", c.ClusterLabel, "gossip cluster label; members with another label are ignored")
	fs.Func(prefix+"secret-key", "base64 gossip encryption key (16, 24 or 32 bytes)", func(s string) error {
		k, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return errors.New("secret key is not valid base64")
		}
		c.SecretKey = k
		return nil
	})
	fs.StringVar(&c.KeyringFile, prefix+"keyring-file", c.KeyringFile, "file of base64 gossip keys, one per line, the first the primary; re-read and installed when it changes (key rotation, docs/security.md)")
	fs.DurationVar(&c.KeyringCheckInterval, prefix+"keyring-check-interval", c.KeyringCheckInterval, "how often the keyring file is re-read")
	fs.BoolVar(&c.RequireEncryption, prefix+"require-encryption", c.RequireEncryption, "refuse to start without a secret key or keyring file")
	fs.DurationVar(&c.Interval, prefix+"interval", c.Interval, "coalescing interval for load broadcasts")
	fs.DurationVar(&c.DigestInterval, prefix+"digest-interval", c.DigestInterval, "sampling interval for KV index digests")
	fs.DurationVar(&c.GracePeriod, prefix+"grace-period", c.GracePeriod, "how long a departed replica's load is kept")
	fs.DurationVar(&c.GossipInterval, prefix+"gossip-interval", c.GossipInterval, "memberlist gossip interval")
	fs.IntVar(&c.GossipNodes, prefix+"gossip-nodes", c.GossipNodes, "memberlist gossip fan-out")
	fs.IntVar(&c.RetransmitMult, prefix+"retransmit-mult", c.RetransmitMult, "memberlist retransmit multiplier")
	fs.DurationVar(&c.PushPullInterval, prefix+"push-pull-interval", c.PushPullInterval, "anti-entropy interval: push-pull exchanges digests and fetches what differs")
	fs.DurationVar(&c.ProbeInterval, prefix+"probe-interval", c.ProbeInterval, "failure detector probe interval")
	fs.DurationVar(&c.ProbeTimeout, prefix+"probe-timeout", c.ProbeTimeout, "failure detector probe timeout")
	fs.IntVar(&c.SuspicionMult, prefix+"suspicion-mult", c.SuspicionMult, "failure detector suspicion multiplier")
	fs.IntVar(&c.MaxMessageBytes, prefix+"max-message-bytes", c.MaxMessageBytes, "largest gossip message; larger ones are split")
	fs.IntVar(&c.InboxSize, prefix+"inbox-size", c.InboxSize, "received messages that may wait for processing before drops")
	fs.IntVar(&c.PredictionQueueSize, prefix+"prediction-queue-size", c.PredictionQueueSize, "predictions that may wait to be gossiped before drops")
	fs.DurationVar(&c.LeaveTimeout, prefix+"leave-timeout", c.LeaveTimeout, "graceful leave timeout on shutdown")
	fs.StringVar(&c.Meta.HTTPAddr, prefix+"http-addr", c.Meta.HTTPAddr, "HTTP address advertised in node meta")
}
