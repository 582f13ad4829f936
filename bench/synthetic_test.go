package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSyntheticTraceIsDeterministicForASeed(t *testing.T) {
	cfg := DefaultSyntheticConfig()
	cfg.Requests, cfg.Turns, cfg.Seed = 300, 4, 42
	cfg.Classes = []ClassMix{{Name: "chat", Weight: 3, Priority: 1, Deadline: 2 * time.Second}, {Name: "batch", Weight: 1}}
	a, err := GenerateSynthetic(cfg)
	require.NoError(t, err)
	b, err := GenerateSynthetic(cfg)
	require.NoError(t, err)
	require.Equal(t, a, b, "same config, same trace")
	assert.Equal(t, a[10].Tokens(DefaultVocab()), b[10].Tokens(DefaultVocab()))

	cfg.Seed = 43
	c, err := GenerateSynthetic(cfg)
	require.NoError(t, err)
	assert.NotEqual(t, a, c, "another seed, another trace")
}

func TestSyntheticTraceIsInArrivalOrderWithDenseIndexes(t *testing.T) {
	cfg := DefaultSyntheticConfig()
	cfg.Requests, cfg.Turns, cfg.ThinkTime = 500, 5, 30*time.Second
	reqs, err := GenerateSynthetic(cfg)
	require.NoError(t, err)
	require.Len(t, reqs, 500)
	assert.Equal(t, time.Duration(0), reqs[0].Arrival)
	for i := range reqs {
		require.Equal(t, i, reqs[i].Index)
		if i > 0 {
			require.GreaterOrEqual(t, reqs[i].Arrival, reqs[i-1].Arrival)
		}
		total := 0
		for _, s := range reqs[i].Segments {
			total += s.Len
		}
		require.Equal(t, reqs[i].InputLength, total)
	}
}

func TestSyntheticTurnsExtendTheirSessionsPreviousPrompt(t *testing.T) {
	cfg := DefaultSyntheticConfig()
	cfg.Requests, cfg.Turns, cfg.PrefixGroups = 400, 6, 2
	reqs, err := GenerateSynthetic(cfg)
	require.NoError(t, err)
	v := DefaultVocab()
	prev := map[string]TraceRequest{}
	checked := 0
	for _, q := range reqs {
		if p, ok := prev[q.Session]; ok {
			require.Equal(t, p.Turn+1, q.Turn, "turns of a session arrive in order")
			require.Greater(t, q.InputLength, p.InputLength+p.OutputLength-1)
			pt, qt := p.Tokens(v), q.Tokens(v)
			require.Equal(t, pt, qt[:len(pt)], "turn %d of %s starts with turn %d's prompt", q.Turn, q.Session, p.Turn)
			checked++
		}
		prev[q.Session] = q
	}
	assert.Positive(t, checked, "the trace has multi-turn sessions")

	// Two prefix groups: sessions' first PrefixTokens tokens take two values.
	prefixes := map[uint32]int{}
	for _, q := range reqs {
		prefixes[q.Tokens(v)[0]]++
	}
	assert.Len(t, prefixes, 2)
}

func TestSyntheticClassMixFollowsTheWeights(t *testing.T) {
	cfg := DefaultSyntheticConfig()
	cfg.Requests = 4000
	cfg.Classes = []ClassMix{{Name: "chat", Weight: 3, Priority: 2, Deadline: time.Second}, {Name: "batch", Weight: 1}}
	reqs, err := GenerateSynthetic(cfg)
	require.NoError(t, err)
	n := map[string]int{}
	for _, q := range reqs {
		n[q.Class]++
		if q.Class == "chat" {
			require.Equal(t, 2, q.Priority)
			require.Equal(t, time.Second, q.Deadline)
		}
	}
	assert.InDelta(t, 0.75, float64(n["chat"])/4000, 0.04)
}

func TestSyntheticArrivalRateMatchesTheConfig(t *testing.T) {
	cfg := DefaultSyntheticConfig()
	cfg.Requests, cfg.Rate = 5000, 20
	reqs, err := GenerateSynthetic(cfg)
	require.NoError(t, err)
	rate := float64(len(reqs)-1) / reqs[len(reqs)-1].Arrival.Seconds()
	assert.InDelta(t, 20, rate, 1.5, "Poisson arrivals at the configured mean rate")
}

func TestSyntheticConfigValidationNamesTheBadField(t *testing.T) {
	for field, mutate := range map[string]func(*SyntheticConfig){
		"requests":      func(c *SyntheticConfig) { c.Requests = 0 },
		"rate":          func(c *SyntheticConfig) { c.Rate = 0 },
		"prefix_tokens": func(c *SyntheticConfig) { c.PrefixTokens = 0 },
		"input_tokens":  func(c *SyntheticConfig) { c.InputTokens = 0 },
		"turns":         func(c *SyntheticConfig) { c.Turns = 0 },
		"classes[0].weight": func(c *SyntheticConfig) {
			c.Classes = []ClassMix{{Name: "x"}}
		},
		"prompts can reach": func(c *SyntheticConfig) { c.Turns, c.InputTokens = 1000, 100000 },
	} {
		cfg := DefaultSyntheticConfig()
		mutate(&cfg)
		err := cfg.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig, field)
		assert.Contains(t, err.Error(), field)
	}
}

func TestParseClassMixReadsNameWeightPriorityDeadline(t *testing.T) {
	m, err := ParseClassMix("chat:3:1:2s, batch:1")
	require.NoError(t, err)
	assert.Equal(t, []ClassMix{{Name: "chat", Weight: 3, Priority: 1, Deadline: 2 * time.Second}, {Name: "batch", Weight: 1}}, m)
	_, err = ParseClassMix("chat")
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, err = ParseClassMix("chat:x")
	assert.ErrorIs(t, err, ErrInvalidConfig)
}
