package app

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestDebugClusterNamesEveryReplicaAddressAndVersionInSnakeCase(t *testing.T) {
	c := newTestCluster(t, 1)
	a, _ := c.startReplica("r1"), c.startReplica("r2")
	c.waitOwned(defaultClasses, "r1", "r2")

	var body []byte
	var doc clusterDoc
	testenv.Eventually(t, 15*time.Second, func() bool {
		resp, err := http.Get("http://" + a.status.HTTPAddr + "/debug/cluster")
		if err != nil {
			return false
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		doc = clusterDoc{}
		return json.Unmarshal(body, &doc) == nil && len(doc.Replicas) == 2 && len(doc.Members) == 2 &&
			len(doc.Workers) == 1 && doc.Workers[0].Health == "healthy"
	}, "two replicas, two gossip members and one healthy worker in %s", &body)

	require.Empty(t, regexp.MustCompile(`"[A-Z][A-Za-z]*":`).FindAllString(string(body), -1), "every key is snake_case")
	require.Equal(t, "r1", doc.Self)
	require.Equal(t, "ready", doc.State)
	require.Equal(t, "connected", doc.NATS)
	for _, r := range doc.Replicas {
		require.NotEmpty(t, r.HTTPAddr, r.ID)
		require.NotEmpty(t, r.Version, r.ID)
		require.True(t, r.Ready, r.ID)
	}
	for _, m := range doc.Members {
		require.NotEmpty(t, m.HTTPAddr, "gossip member %s advertises its API", m.Name)
		require.NotEmpty(t, m.Version, "gossip member %s advertises its build", m.Name)
	}
	require.NotNil(t, doc.Workers[0].Reported)
	require.Equal(t, a.status.HTTPAddr, doc.HTTPAddr)
}
