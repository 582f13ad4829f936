package app

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// registerWithout registers on fs what register registers, except the
// flags named in drop: a part's setting that the subcommand fills in
// itself (the replica's listen address, its gossip node name) gets one
// name, the subcommand's, and no second flag that would be accepted and
// ignored.
func registerWithout(fs *flag.FlagSet, register func(*flag.FlagSet), drop ...string) {
	tmp := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	register(tmp)
	for _, d := range drop {
		if tmp.Lookup(d) == nil {
			panic("registerWithout: no flag -" + d) // a programming error: every subcommand's test builds its flags
		}
	}
	tmp.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(drop, f.Name) {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
}

// removedFlags maps a subcommand's removed flag names to what replaces
// them: given on the command line they fail with that advice rather than
// the flag package's bare "flag provided but not defined".
var removedFlags = map[string]map[string]string{
	"router": {
		"http.addr":                "-http-addr ADDR is the API's listen address",
		"gossip.node-name":         "the gossip node name is -id",
		"metrics.refresh-interval": "a router pushes its admission counters every -gossip.interval",
		"ingest.cluster":           "the KV event subjects use -cluster",
		"model":                    "admission metrics have no model label (a class queue holds every model's requests); request metrics use the request's model",
	},
}

// checkRemovedFlags fails with advice when args name a removed flag of fs.
func checkRemovedFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	removed := removedFlags[fs.Name()]
	for _, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue // a flag's value
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if why, ok := removed[name]; ok && fs.Lookup(name) == nil {
			_, _ = fmt.Fprintf(stderr, "%s: -%s was removed: %s\n", fs.Name(), name, why)
			return ErrUsage
		}
	}
	return nil
}
