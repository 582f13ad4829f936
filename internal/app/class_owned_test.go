package app

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
)

// classOwned reads one replica's switchyard_cluster_class_owned series.
func classOwned(t *testing.T, r *runningReplica) map[string]float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != metrics.NameClusterClassOwned {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == metrics.LabelClass {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// Every replica exports class_owned for every class of the policy (0 when
// another replica or nobody owns it), so the sum over replicas is the
// number of owners; a class removed from the policy loses its series.
func TestClassOwnedHasOneSeriesPerPolicyClassOnEveryReplicaSummingToOneOwner(t *testing.T) {
	c := newTestCluster(t, 1)
	policy := "default_class: gold\nclasses:\n  - name: gold\n    quantum: 1024\n  - name: silver\n    quantum: 512\n  - name: bronze\n    quantum: 256\n"
	withPolicy := func(rc *ReplicaConfig) { rc.PolicyYAML = []byte(policy) }
	r1 := c.startReplicaWith("r1", "127.0.0.1:0", withPolicy)
	r2 := c.startReplicaWith("r2", "127.0.0.1:0", withPolicy)
	classes := []string{"gold", "silver", "bronze"}
	c.waitPlaced(classes, "r1", "r2")

	sums := func(want []string) bool {
		a, b := classOwned(t, r1), classOwned(t, r2)
		if len(a) != len(want) || len(b) != len(want) {
			return false
		}
		for _, class := range want {
			av, aok := a[class]
			bv, bok := b[class]
			if !aok || !bok || av+bv != 1 {
				return false
			}
		}
		return true
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return sums(classes) },
		"each replica has a series per class and exactly one owns each")

	less := "default_class: gold\nclasses:\n  - name: gold\n    quantum: 1024\n  - name: silver\n    quantum: 512\n"
	_, err := cluster.SeedConfig(testenv.Context(t), c.etcd.Client(t), "test", []byte(less), true)
	require.NoError(t, err)
	testenv.Eventually(t, 10*time.Second, func() bool { return sums(classes[:2]) },
		"the removed class's series are gone and the others still sum to one owner")
}
