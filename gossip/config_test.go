package gossip

import (
	"encoding/base64"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDefaultConfigWithANodeNameIsValid(t *testing.T) {
	c := DefaultConfig()
	require.ErrorIs(t, c.Validate(), ErrInvalidConfig, "the node name has no default")
	c.NodeName = "r1"
	require.NoError(t, c.Validate())
}

func TestValidateNamesTheBadField(t *testing.T) {
	cases := map[string]func(*Config){
		"SecretKey":       func(c *Config) { c.SecretKey = []byte("short") },
		"ClusterLabel":    func(c *Config) { c.ClusterLabel = strings.Repeat("x", 256) },
		"Interval":        func(c *Config) { c.Interval = 0 },
		"GracePeriod":     func(c *Config) { c.GracePeriod = -time.Second },
		"BindPort":        func(c *Config) { c.BindPort = 70000 },
		"ProbeTimeout":    func(c *Config) { c.ProbeTimeout = 2 * c.ProbeInterval },
		"MaxMessageBytes": func(c *Config) { c.MaxMessageBytes = 1400 },
		"InboxSize":       func(c *Config) { c.InboxSize = 0 },
		"Meta.ReplicaID":  func(c *Config) { c.Meta.ReplicaID = "someone-else" },
		"Join[1]":         func(c *Config) { c.Join = []string{"a:1", ""} },
	}
	for field, mutate := range cases {
		t.Run(field, func(t *testing.T) {
			c := testConfig("r1")
			mutate(&c)
			err := c.Validate()
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.Contains(t, err.Error(), field+":")
		})
	}
}

func TestFlagsSetTheConfig(t *testing.T) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.RegisterFlags(fs, "gossip.")
	key := base64.StdEncoding.EncodeToString(testKey)
	require.NoError(t, fs.Parse([]string{
		"-gossip.node-name=r9", "-gossip.join=a:1, b:2", "-gossip.secret-key=" + key,
		"-gossip.grace-period=3s", "-gossip.cluster-label=prod",
	}))
	require.Equal(t, "r9", c.NodeName)
	require.Equal(t, []string{"a:1", "b:2"}, c.Join)
	require.Equal(t, testKey, c.SecretKey)
	require.Equal(t, 3*time.Second, c.GracePeriod)
	require.Equal(t, "prod", c.ClusterLabel)
	require.NoError(t, c.Validate())
	require.Error(t, fs.Parse([]string{"-gossip.secret-key=!!"}), "a key that is not base64 is a flag error")
}
