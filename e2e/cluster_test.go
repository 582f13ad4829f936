package e2e

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const view1 = `{"self":"router-1","degraded":false,
 "replicas":[{"ID":"router-1","Ready":true},{"ID":"router-2","Ready":true},{"ID":"router-3","Ready":false}],
 "owners":{"interactive":{"replica":"router-1","epoch":7},"batch":{"replica":"router-2","epoch":9}},
 "workers":[{"ID":"worker-1"},{"ID":"worker-2"}]}`

const view2 = `{"self":"router-2","degraded":false,
 "replicas":[{"ID":"router-1","Ready":true},{"ID":"router-2","Ready":true}],
 "owners":{"interactive":{"replica":"router-1","epoch":7},"batch":{"replica":"router-2","epoch":9}},
 "workers":[{"ID":"worker-1"},{"ID":"worker-2"}]}`

func decodeBoth(t *testing.T) []ClusterInfo {
	a, err := DecodeClusterInfo([]byte(view1))
	require.NoError(t, err)
	b, err := DecodeClusterInfo([]byte(view2))
	require.NoError(t, err)
	return []ClusterInfo{a, b}
}

func TestDecodeClusterInfoReadsOwnersReplicasAndWorkers(t *testing.T) {
	ci := decodeBoth(t)[0]
	assert.Equal(t, "router-1", ci.Self)
	assert.Equal(t, "router-2", ci.OwnerOf("batch"))
	assert.Equal(t, "", ci.OwnerOf("realtime"))
	assert.Len(t, ci.Workers, 2)
	assert.Equal(t, "[batch=router-2 interactive=router-1]", OwnerSummary(ci))
}

func TestDecodeClusterInfoRejectsDocumentsWithoutSelfOrOwners(t *testing.T) {
	for _, doc := range []string{`{}`, `{"self":"r"}`, `{"owners":{}}`, `[1]`, `nul`} {
		_, err := DecodeClusterInfo([]byte(doc))
		assert.ErrorIsf(t, err, ErrMalformedClusterInfo, "%s", doc)
	}
}

func TestSettledWhenLiveRoutersAgreeOnLiveOwnersForEveryClass(t *testing.T) {
	views := decodeBoth(t)
	ok, why := Settled(views, []string{"router-1", "router-2"}, []string{"interactive", "batch"}, 2)
	assert.True(t, ok, why)
}

func TestNotSettledWhileADeadRouterStillOwnsAClass(t *testing.T) {
	views := decodeBoth(t)
	ok, why := Settled(views[:1], []string{"router-1"}, []string{"batch"}, 2)
	assert.False(t, ok)
	assert.Contains(t, why, "dead router-2 owning batch")
}

func TestNotSettledWhenRoutersDisagreeMissAWorkerOrAreDegraded(t *testing.T) {
	live, cls := []string{"router-1", "router-2"}, []string{"interactive", "batch"}
	views := decodeBoth(t)
	o := views[1].Owners["batch"]
	o.Epoch++
	views[1].Owners["batch"] = o
	ok, why := Settled(views, live, cls, 2)
	assert.False(t, ok)
	assert.Contains(t, why, "disagree")

	views = decodeBoth(t)
	ok, why = Settled(views, live, cls, 3)
	assert.False(t, ok)
	assert.Contains(t, why, "workers")

	views = decodeBoth(t)
	views[1].Degraded = true
	ok, why = Settled(views, live, cls, 2)
	assert.False(t, ok)
	assert.Contains(t, why, "degraded")

	ok, why = Settled(views[:1], live, cls, 2)
	assert.False(t, ok)
	assert.Contains(t, why, "answered")
}

func FuzzDecodeClusterInfo(f *testing.F) {
	for _, s := range []string{view1, view2, `{}`, `{"self":"x","owners":{}}`, `{"self":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		ci, err := DecodeClusterInfo(in)
		if err != nil {
			if !errors.Is(err, ErrMalformedClusterInfo) {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		if ci.Self == "" || ci.Owners == nil {
			t.Fatalf("accepted a document without self or owners: %q", in)
		}
	})
}
