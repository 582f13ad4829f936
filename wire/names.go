package wire

import (
	"fmt"
	"strings"
)

// Subjects spells every NATS subject of one cluster. All subjects live under
// "sy.<cluster>." so that several clusters can share one NATS deployment.
type Subjects struct {
	prefix string
}

// NewSubjects returns the subject names for cluster.
func NewSubjects(cluster string) Subjects {
	return Subjects{prefix: "sy." + cluster + "."}
}

// KV is where worker publishes its KV event batches (plain publish).
func (s Subjects) KV(worker string) string { return s.prefix + "kv." + worker }

// KVAll matches every worker's KV event subject.
func (s Subjects) KVAll() string { return s.prefix + "kv.*" }

// Load is where worker publishes its load reports.
func (s Subjects) Load(worker string) string { return s.prefix + "load." + worker }

// LoadAll matches every worker's load subject.
func (s Subjects) LoadAll() string { return s.prefix + "load.*" }

// KVDump is the request-reply subject on which worker answers full dumps.
func (s Subjects) KVDump(worker string) string { return s.prefix + "kvdump." + worker }

// Admit is the request-reply subject the owner of class listens on.
func (s Subjects) Admit(class string) string { return s.prefix + "admit." + class }

// Cancel carries cancellations of queued requests of class.
func (s Subjects) Cancel(class string) string { return s.prefix + "cancel." + class }

// Life carries lifecycle marks (dispatched, first token, done, aborted,
// renewals) addressed to the replica owner.
func (s Subjects) Life(owner string) string { return s.prefix + "life." + owner }

// Adopt carries in-flight bookings re-homed to the new owner of class.
func (s Subjects) Adopt(class string) string { return s.prefix + "adopt." + class }

// WorkerFromSubject returns the last token of a per-worker subject such as
// "sy.c.kv.w1".
func WorkerFromSubject(subject string) string {
	i := strings.LastIndexByte(subject, '.')
	return subject[i+1:]
}

// Keys spells every etcd key of one cluster, under "/switchyard/<cluster>/".
type Keys struct {
	prefix string
}

// NewKeys returns the etcd key names for cluster.
func NewKeys(cluster string) Keys {
	return Keys{prefix: "/switchyard/" + cluster + "/"}
}

// Prefix is the root of the cluster's keys.
func (k Keys) Prefix() string { return k.prefix }

// Replicas is the prefix of the replica registry.
func (k Keys) Replicas() string { return k.prefix + "replicas/" }

// Replica is one replica's lease-bound registration key.
func (k Keys) Replica(id string) string { return k.Replicas() + id }

// Workers is the prefix of the worker registry.
func (k Keys) Workers() string { return k.prefix + "workers/" }

// Worker is one worker's lease-bound registration key.
func (k Keys) Worker(id string) string { return k.Workers() + id }

// Classes is the prefix of the class ownership keys.
func (k Keys) Classes() string { return k.prefix + "classes/" }

// ClassOwner is the lease-bound ownership key of class.
func (k Keys) ClassOwner(class string) string { return k.Classes() + class + "/owner" }

// ClassFromOwnerKey extracts the class name from a ClassOwner key.
func (k Keys) ClassFromOwnerKey(key string) (string, error) {
	rest, ok := strings.CutPrefix(key, k.Classes())
	if !ok {
		return "", fmt.Errorf("%w: key %q is not under %q", ErrMalformed, key, k.Classes())
	}
	name, ok := strings.CutSuffix(rest, "/owner")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("%w: key %q is not a class owner key", ErrMalformed, key)
	}
	return name, nil
}

// PolicyConfig is the key holding the policy classes configuration.
func (k Keys) PolicyConfig() string { return k.prefix + "config/policy" }

// ValidName reports whether s may be used as a worker, replica or class name:
// it becomes a NATS subject token and an etcd key segment, so it must be
// non-empty, at most 128 bytes, and made of [A-Za-z0-9_-].
func ValidName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
