package cluster

import (
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDefaultConfigsAreValid(t *testing.T) {
	require.NoError(t, DefaultSessionConfig().Validate())
	require.NoError(t, DefaultRegistryConfig().Validate())
	o := DefaultOwnershipConfig()
	o.ReplicaID = "r1"
	require.NoError(t, o.Validate())
}

func TestConfigValidateNamesTheBadField(t *testing.T) {
	cases := map[string]struct {
		err   error
		field string
	}{
		"session ttl not whole seconds": {func() error { c := DefaultSessionConfig(); c.TTL = 1500 * time.Millisecond; return c.Validate() }(), "TTL"},
		"session renew too slow":        {func() error { c := DefaultSessionConfig(); c.RenewInterval = c.TTL / 2; return c.Validate() }(), "RenewInterval"},
		"session bad cluster":           {func() error { c := DefaultSessionConfig(); c.Cluster = "a.b"; return c.Validate() }(), "Cluster"},
		"registry no retry":             {func() error { c := DefaultRegistryConfig(); c.RetryInterval = 0; return c.Validate() }(), "RetryInterval"},
		"ownership no replica id":       {DefaultOwnershipConfig().Validate(), "ReplicaID"},
		"ownership negative settle": {func() error {
			c := DefaultOwnershipConfig()
			c.ReplicaID, c.SettlePeriod = "r", -time.Second
			return c.Validate()
		}(), "SettlePeriod"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			require.True(t, errors.Is(c.err, ErrInvalidConfig), "err = %v", c.err)
			require.True(t, strings.Contains(c.err.Error(), c.field), "%q does not name %s", c.err, c.field)
		})
	}
}

func TestConfigFlagsOverrideDefaults(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	s, o := DefaultSessionConfig(), DefaultOwnershipConfig()
	s.RegisterFlags(fs, "cluster.")
	o.RegisterFlags(fs, "cluster.")
	require.NoError(t, fs.Parse([]string{"-cluster.session-ttl=3s", "-cluster.ownership-settle=1s"}))
	require.Equal(t, 3*time.Second, s.TTL)
	require.Equal(t, time.Second, o.SettlePeriod)
}
