package frontend

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
)

func TestExamplePolicyFileParsesIntoSchedulerClasses(t *testing.T) {
	p, err := LoadPolicy(filepath.Join("testdata", "policy.yaml"))
	require.NoError(t, err)

	require.Equal(t, []string{"interactive", "batch", "realtime"}, p.ClassNames())
	assert.Equal(t, "interactive", p.DefaultClass)

	interactive := p.Classes[0]
	assert.Equal(t, int64(2048), interactive.Quantum)
	assert.Equal(t, scheduler.PolicyFCFS, interactive.Policy)
	assert.Equal(t, scheduler.Limits{Requests: 64, ISLTokens: 262144, CachedTokens: scheduler.Unlimited}, interactive.Limits,
		"an absent limit is unlimited")
	assert.Equal(t, 16384, interactive.BusyPrefillTokens)
	assert.InDelta(t, 0.95, interactive.BusyDecodeFraction, 1e-9)
	assert.Equal(t, ClassDefaults{Priority: 1}, p.Defaults("interactive"))

	assert.Equal(t, scheduler.PolicyWSPT, p.Classes[1].Policy)
	assert.Equal(t, 10*time.Minute, p.Defaults("batch").Deadline)
	assert.Equal(t, scheduler.PolicyLCFS, p.Classes[2].Policy)
	assert.Equal(t, 0, p.Classes[2].Limits.Requests, "an explicit zero limit stays zero")
	for _, c := range p.Classes {
		require.NoError(t, c.Validate(), "class %s", c.Name)
	}
}

func TestDocumentedPolicyExampleIsTheTestdataFile(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "policy.md"))
	require.NoError(t, err)
	example, err := os.ReadFile(filepath.Join("testdata", "policy.yaml"))
	require.NoError(t, err)
	assert.Contains(t, string(doc), strings.TrimSpace(string(example)), "docs/policy.md must show testdata/policy.yaml verbatim")
}

func TestRulesClassifyByHeaderModelAndUserInOrder(t *testing.T) {
	p, err := LoadPolicy(filepath.Join("testdata", "policy.yaml"))
	require.NoError(t, err)

	h := http.Header{}
	h.Set("X-Tenant", "batch-nightly")
	assert.Equal(t, "batch", p.Classify("m", "", h), "header rule")
	assert.Equal(t, "batch", p.Classify("llama-offline", "voice-7", nil), "model rule comes before the user rule")
	assert.Equal(t, "realtime", p.Classify("llama", "voice-7", nil), "user rule")
	h.Set("X-Tenant", "web")
	assert.Equal(t, "interactive", p.Classify("llama", "alice", h), "no rule matches: default class")
}

func TestHeaderRuleWithoutValueMatchesThePresenceOfTheHeader(t *testing.T) {
	p, err := ParsePolicy([]byte(`
default_class: a
classes: [{name: a}, {name: b}]
rules: [{class: b, match: {header: {name: x-bulk}}}]
`))
	require.NoError(t, err)
	h := http.Header{}
	assert.Equal(t, "a", p.Classify("m", "", h))
	h.Set("X-Bulk", "anything")
	assert.Equal(t, "b", p.Classify("m", "", h))
}

func TestASinglePolicyClassIsTheDefaultClass(t *testing.T) {
	p, err := ParsePolicy([]byte("classes: [{name: only, policy: lcfs}]"))
	require.NoError(t, err)
	assert.Equal(t, "only", p.DefaultClass)
	assert.Equal(t, int64(DefaultQuantum), p.Classes[0].Quantum)
}

func TestDefaultPolicyIsOneUnlimitedFCFSClass(t *testing.T) {
	p := DefaultPolicy()
	require.Len(t, p.Classes, 1)
	require.NoError(t, p.Classes[0].Validate())
	assert.Equal(t, "default", p.DefaultClass)
	assert.True(t, p.HasClass("default"))
}

func TestPolicyValidationNamesTheBadField(t *testing.T) {
	cases := map[string]struct {
		doc, field string
	}{
		"no classes":         {"classes: []", "classes"},
		"unknown key":        {"classes: [{name: a, qantum: 3}]", "qantum"},
		"bad name":           {"classes: [{name: 'a b'}]", "classes[0].name"},
		"duplicate name":     {"classes: [{name: a}, {name: a}]", "classes[1].name"},
		"bad policy":         {"classes: [{name: a, policy: fifo}]", "classes[0].policy"},
		"negative deadline":  {"classes: [{name: a, deadline_ms: -1}]", "classes[0].deadline_ms"},
		"unknown default":    {"default_class: z\nclasses: [{name: a}, {name: b}]", "default_class"},
		"missing default":    {"classes: [{name: a}, {name: b}]", "default_class"},
		"rule unknown class": {"classes: [{name: a}]\nrules: [{class: z, match: {model: m}}]", "rules[0].class"},
		"rule matches all":   {"classes: [{name: a}]\nrules: [{class: a}]", "rules[0].match"},
		"rule bad glob":      {"classes: [{name: a}]\nrules: [{class: a, match: {model: '['}}]", "rules[0].match.model"},
		"header no name":     {"classes: [{name: a}]\nrules: [{class: a, match: {header: {value: x}}}]", "rules[0].match.header.name"},
		"not yaml":           {"classes: [", "yaml"},
		"degraded quotas":    {"classes: [{name: a}]\ndegraded: {quotas: halves}", "degraded.quotas"},
		"degraded key":       {"classes: [{name: a}]\ndegraded: {quota: split}", "quota"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(tc.doc))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadPolicy), "wraps ErrBadPolicy: %v", err)
			assert.Contains(t, err.Error(), tc.field)
		})
	}
}

func TestThePolicyFileChoosesTheDegradedQuotaPolicySplitByDefault(t *testing.T) {
	p, err := ParsePolicy([]byte("classes: [{name: a}]"))
	require.NoError(t, err)
	assert.Equal(t, DegradedQuotasSplit, p.DegradedQuotas, "absent: split")
	assert.Equal(t, DegradedQuotasSplit, DefaultPolicy().DegradedQuotas)
	for _, v := range []string{DegradedQuotasSplit, DegradedQuotasWhole, DegradedQuotasClosed} {
		p, err := ParsePolicy([]byte("classes: [{name: a}]\ndegraded: {quotas: " + v + "}"))
		require.NoError(t, err, v)
		assert.Equal(t, v, p.DegradedQuotas)
	}
}

func TestNegativeQuantumIsRejectedByTheSchedulersValidation(t *testing.T) {
	_, err := ParsePolicy([]byte("classes: [{name: a, quantum: -5}]"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "classes[0]")
}

func TestThePolicyFileMapsModelsToTokenizers(t *testing.T) {
	p, err := ParsePolicy([]byte("classes: [{name: a}]\ntokenizers: {llama: /models/llama, sim: 'tiktoken:o200k_base'}"))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"llama": "/models/llama", "sim": "tiktoken:o200k_base"}, p.Tokenizers)
	_, err = ParsePolicy([]byte("classes: [{name: a}]\ntokenizers: {llama: ''}"))
	require.ErrorIs(t, err, ErrBadPolicy)
	assert.Contains(t, err.Error(), "tokenizers")
}
