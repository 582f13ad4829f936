package app

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/tenant"
)

func TestKeysHashReadsTheKeyFromStdinAndPrintsItsHash(t *testing.T) {
	var out, errOut bytes.Buffer
	require.NoError(t, keys([]string{"hash"}, strings.NewReader("sk-secret\n"), &out, &errOut))
	require.Equal(t, tenant.HashKey("sk-secret")+"\n", out.String())
}

func TestKeysHashRefusesAKeyOnTheCommandLine(t *testing.T) {
	var out, errOut bytes.Buffer
	require.ErrorIs(t, keys([]string{"hash", "sk-secret"}, strings.NewReader(""), &out, &errOut), ErrUsage)
	require.Empty(t, out.String())
	require.NotContains(t, errOut.String(), "sk-secret")
}

func TestKeysGenerateMakesAKeyThatTheKeysFileAccepts(t *testing.T) {
	var out, errOut bytes.Buffer
	require.NoError(t, keys([]string{"generate"}, nil, &out, &errOut))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2)
	key := strings.TrimSpace(strings.TrimPrefix(lines[0], "key:"))
	hash := strings.TrimSpace(strings.TrimPrefix(lines[1], "hash:"))
	set, err := tenant.Parse([]byte("tenants: [{id: a, keys: [\"" + hash + "\"]}]"))
	require.NoError(t, err)
	got, ok := set.Lookup(key)
	require.True(t, ok)
	require.Equal(t, "a", got.ID)
}
