package app

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEveryFlagOfEverySubcommandIsInItsSectionOfConfigurationMD reads each
// subcommand's -h and looks for every flag in its section of
// docs/configuration.md, as `-name` or under a wildcard row (`-etcd.*`).
func TestEveryFlagOfEverySubcommandIsInItsSectionOfConfigurationMD(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	require.NoError(t, err)
	doc := string(raw)
	flagLine := regexp.MustCompile(`(?m)^  -([a-z0-9.-]+)`)
	wildcard := regexp.MustCompile("`-([a-z0-9.-]+)\\*`")
	for _, c := range []struct {
		name string
		run  func(context.Context, []string, io.Writer, io.Writer) error
	}{{"router", Router}, {"worker", Worker}, {"adapter", Adapter}, {"up", Up}, {"healthcheck", Healthcheck}} {
		_, section, ok := strings.Cut(doc, "\n## switchyard "+c.name+"\n")
		require.True(t, ok, "no section for %s", c.name)
		if i := strings.Index(section, "\n## "); i >= 0 {
			section = section[:i]
		}
		var prefixes []string
		for _, m := range wildcard.FindAllStringSubmatch(section, -1) {
			prefixes = append(prefixes, m[1])
		}
		var help bytes.Buffer
		_ = c.run(context.Background(), []string{"-h"}, io.Discard, &help)
		names := flagLine.FindAllStringSubmatch(help.String(), -1)
		require.NotEmpty(t, names, "%s -h printed no flags", c.name)
		for _, m := range names {
			f := m[1]
			if strings.Contains(section, "`-"+f+"`") {
				continue
			}
			covered := false
			for _, p := range prefixes {
				covered = covered || strings.HasPrefix(f, p)
			}
			assert.Truef(t, covered, "switchyard %s -%s is not in its section of docs/configuration.md", c.name, f)
		}
	}
}
