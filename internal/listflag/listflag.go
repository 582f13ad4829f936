// Package listflag reads the comma-separated lists that flags take
// (-gossip.join, -http.session-headers, -target, ...): one reading for
// every subcommand. It is a leaf: it imports nothing of ours.
package listflag

import "strings"

// Split returns the comma-separated items of s, trimmed, without the
// empty ones: "a, b,,c" → [a b c]; "" → nil.
func Split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
