package bench

import (
	"cmp"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SyntheticConfig describes a seedable synthetic trace: sessions arrive as a
// Poisson process, each picks a shared system prefix group and a class, and
// runs 1..Turns turns separated by exponential think times. Turn k's prompt
// is the prefix, then every earlier turn's user input and reply, then the new
// user input, so each turn extends the previous turn's prompt (multi-turn
// prefix reuse) and sessions of a group share the prefix.
type SyntheticConfig struct {
	// Seed makes the trace reproducible: equal configs give equal traces.
	Seed uint64
	// Requests is the number of requests (turns) generated.
	Requests int
	// Rate is the mean request arrival rate per second over all sessions.
	Rate float64
	// PrefixGroups is the number of distinct shared prefixes (0: none).
	PrefixGroups int
	// PrefixTokens is the shared prefix length in tokens.
	PrefixTokens int
	// InputTokens is the mean new user input per turn; lengths are uniform
	// in [InputTokens/2, 3·InputTokens/2].
	InputTokens int
	// OutputTokens is the mean output per turn, drawn like InputTokens.
	OutputTokens int
	// Turns is the maximum turns per session; a session's turn count is
	// uniform in [1, Turns].
	Turns int
	// ThinkTime is the mean (exponential) gap between a session's turns.
	// Arrivals stay open-loop: a turn does not wait for the previous reply.
	ThinkTime time.Duration
	// ThinkTimeMax, when above ThinkTime, draws each gap uniformly from
	// [ThinkTime, ThinkTimeMax] instead: an agent's tool calls come back
	// within a bounded time (e.g. 50-500 ms), faster than KV events travel.
	ThinkTimeMax time.Duration
	// Classes is the class/priority/deadline mix, drawn per session by
	// weight. Empty: requests carry no scheduling hints.
	Classes []ClassMix
}

// ClassMix is one entry of a synthetic class mix.
type ClassMix struct {
	Name     string
	Weight   float64
	Priority int
	Deadline time.Duration
}

// DefaultSyntheticConfig is a shared-prefix, single-turn workload.
func DefaultSyntheticConfig() SyntheticConfig {
	return SyntheticConfig{
		Seed:         1,
		Requests:     1000,
		Rate:         10,
		PrefixGroups: 8,
		PrefixTokens: 2048,
		InputTokens:  256,
		OutputTokens: 128,
		Turns:        1,
		ThinkTime:    10 * time.Second,
	}
}

// maxSyntheticRequests bounds a generated trace (it is held in memory).
const maxSyntheticRequests = 10_000_000

// Validate names the first bad field.
func (c SyntheticConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: synthetic %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Requests < 1 || c.Requests > maxSyntheticRequests:
		return bad("requests %d outside [1, %d]", c.Requests, maxSyntheticRequests)
	case !(c.Rate > 0) || math.IsInf(c.Rate, 0):
		return bad("rate %v must be positive and finite", c.Rate)
	case c.PrefixGroups < 0:
		return bad("prefix_groups %d must not be negative", c.PrefixGroups)
	case c.PrefixTokens < 0:
		return bad("prefix_tokens %d must not be negative", c.PrefixTokens)
	case c.PrefixGroups > 0 && c.PrefixTokens == 0:
		return bad("prefix_tokens must be positive when prefix_groups is set")
	case c.InputTokens < 1:
		return bad("input_tokens %d must be positive", c.InputTokens)
	case c.OutputTokens < 1:
		return bad("output_tokens %d must be positive", c.OutputTokens)
	case c.Turns < 1:
		return bad("turns %d must be positive", c.Turns)
	case c.ThinkTime < 0:
		return bad("think_time %v must not be negative", c.ThinkTime)
	case c.ThinkTimeMax < 0:
		return bad("think_time_max %v must not be negative", c.ThinkTimeMax)
	}
	// The longest possible prompt: prefix + every turn's input and reply at
	// their maximum lengths.
	longest := int64(c.PrefixTokens) + int64(c.Turns)*(int64(hiLen(c.InputTokens))+int64(hiLen(c.OutputTokens)))
	if longest > maxInputTokens {
		return bad("prompts can reach %d tokens, more than %d (lower turns, input_tokens, output_tokens or prefix_tokens)", longest, maxInputTokens)
	}
	for i, m := range c.Classes {
		switch {
		case m.Name == "":
			return bad("classes[%d].name is empty", i)
		case !(m.Weight > 0) || math.IsInf(m.Weight, 0):
			return bad("classes[%d].weight %v must be positive and finite", i, m.Weight)
		case m.Deadline < 0:
			return bad("classes[%d].deadline %v must not be negative", i, m.Deadline)
		}
	}
	return nil
}

func loLen(mean int) int { return max(1, mean/2) }
func hiLen(mean int) int { return mean + mean/2 }

// RegisterFlags registers the generator's flags as <prefix>seed, ... with the
// config's current values as defaults.
func (c *SyntheticConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.Uint64Var(&c.Seed, prefix+"seed", c.Seed, "synthetic trace seed")
	fs.IntVar(&c.Requests, prefix+"requests", c.Requests, "synthetic trace length in requests")
	fs.Float64Var(&c.Rate, prefix+"rate", c.Rate, "synthetic mean arrival rate (requests/s, Poisson)")
	fs.IntVar(&c.PrefixGroups, prefix+"prefix-groups", c.PrefixGroups, "number of shared prefixes (0: none)")
	fs.IntVar(&c.PrefixTokens, prefix+"prefix-tokens", c.PrefixTokens, "shared prefix length in tokens")
	fs.IntVar(&c.InputTokens, prefix+"input-tokens", c.InputTokens, "mean new input tokens per turn")
	fs.IntVar(&c.OutputTokens, prefix+"output-tokens", c.OutputTokens, "mean output tokens per turn")
	fs.IntVar(&c.Turns, prefix+"turns", c.Turns, "maximum turns per session (uniform in [1, turns])")
	fs.DurationVar(&c.ThinkTime, prefix+"think-time", c.ThinkTime, "mean gap between a session's turns")
	fs.DurationVar(&c.ThinkTimeMax, prefix+"think-time-max", c.ThinkTimeMax, "above think-time: gaps uniform in [think-time, think-time-max] (agent tool calls) instead of exponential")
	fs.Func(prefix+"classes", "class mix: name:weight[:priority[:deadline]],... e.g. chat:3:1:2s,batch:1", func(s string) error {
		m, err := ParseClassMix(s)
		if err == nil {
			c.Classes = m
		}
		return err
	})
}

// ParseClassMix parses "name:weight[:priority[:deadline]],...", deadline as
// a Go duration ("2s", "500ms"; "0" or absent means none).
func ParseClassMix(s string) ([]ClassMix, error) {
	var out []ClassMix
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.Split(item, ":")
		if len(parts) < 2 || len(parts) > 4 {
			return nil, fmt.Errorf("%w: class mix item %d %q: want name:weight[:priority[:deadline]]", ErrInvalidConfig, i, item)
		}
		m := ClassMix{Name: parts[0]}
		var err error
		if m.Weight, err = strconv.ParseFloat(parts[1], 64); err != nil {
			return nil, fmt.Errorf("%w: class mix item %d %q: weight: %v", ErrInvalidConfig, i, item, err)
		}
		if len(parts) > 2 {
			if m.Priority, err = strconv.Atoi(parts[2]); err != nil {
				return nil, fmt.Errorf("%w: class mix item %d %q: priority: %v", ErrInvalidConfig, i, item, err)
			}
		}
		if len(parts) > 3 && parts[3] != "0" {
			if m.Deadline, err = time.ParseDuration(parts[3]); err != nil {
				return nil, fmt.Errorf("%w: class mix item %d %q: deadline: %v", ErrInvalidConfig, i, item, err)
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// GenerateSynthetic builds the trace described by c, in arrival order.
func GenerateSynthetic(c SyntheticConfig) ([]TraceRequest, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x73796e7468)) // stream constant: "synth"
	meanTurns := float64(1+c.Turns) / 2
	sessionRate := c.Rate / meanTurns
	var totalWeight float64
	for _, m := range c.Classes {
		totalWeight += m.Weight
	}

	// Sessions start in order; a session's later turns can arrive after
	// later sessions' first turns. Once N turns exist, the N-th earliest
	// arrival is an upper bound on the final cutoff, and a session starting
	// after it contributes nothing, so generation stops there.
	var reqs []TraceRequest
	var start float64 // seconds
	cutoff := math.Inf(1)
	for session := 0; ; session++ {
		start += rng.ExpFloat64() / sessionRate
		if start > cutoff {
			break
		}
		reqs = c.appendSession(reqs, rng, session, start, totalWeight)
		if math.IsInf(cutoff, 1) && len(reqs) >= c.Requests {
			arr := make([]time.Duration, len(reqs))
			for i, r := range reqs {
				arr[i] = r.Arrival
			}
			slices.Sort(arr)
			cutoff = arr[c.Requests-1].Seconds()
		}
	}
	slices.SortStableFunc(reqs, func(a, b TraceRequest) int {
		return cmp.Or(cmp.Compare(a.Arrival, b.Arrival), cmp.Compare(a.Index, b.Index))
	})
	reqs = reqs[:c.Requests]
	first := reqs[0].Arrival
	for i := range reqs {
		reqs[i].Index = i
		reqs[i].Arrival -= first
	}
	return reqs, nil
}

// appendSession draws one session's turns. Index temporarily holds a
// generation sequence number so sorting is stable across equal arrivals.
func (c SyntheticConfig) appendSession(reqs []TraceRequest, rng *rand.Rand, session int, start float64, totalWeight float64) []TraceRequest {
	var prefix []Segment
	if c.PrefixGroups > 0 {
		g := uint64(rng.IntN(c.PrefixGroups))
		prefix = []Segment{{Seed: seedOf(domainSynthPrefix, c.Seed, g), Len: c.PrefixTokens}}
	}
	var class ClassMix
	if len(c.Classes) > 0 {
		x := rng.Float64() * totalWeight
		class = c.Classes[len(c.Classes)-1]
		for _, m := range c.Classes {
			if x < m.Weight {
				class = m
				break
			}
			x -= m.Weight
		}
	}
	turns := 1 + rng.IntN(c.Turns)
	history := prefix
	at := start
	for k := 0; k < turns; k++ {
		switch {
		case k == 0:
		case c.ThinkTimeMax > c.ThinkTime:
			at += c.ThinkTime.Seconds() + rng.Float64()*(c.ThinkTimeMax-c.ThinkTime).Seconds()
		default:
			at += rng.ExpFloat64() * c.ThinkTime.Seconds()
		}
		user := Segment{Seed: seedOf(domainSynthUser, c.Seed, uint64(session), uint64(k)), Len: drawLen(rng, c.InputTokens)}
		out := drawLen(rng, c.OutputTokens)
		segs := append(slices.Clip(history), user)
		in := 0
		for _, s := range segs {
			in += s.Len
		}
		reqs = append(reqs, TraceRequest{
			Index:        len(reqs),
			Arrival:      time.Duration(at * float64(time.Second)),
			InputLength:  in,
			OutputLength: out,
			Segments:     segs,
			Class:        class.Name,
			Priority:     class.Priority,
			Deadline:     class.Deadline,
			Session:      "s" + strconv.Itoa(session),
			Turn:         k,
		})
		// The reply is fed back as part of the next turn's prompt.
		history = append(segs, Segment{Seed: seedOf(domainSynthReply, c.Seed, uint64(session), uint64(k)), Len: out})
	}
	return reqs
}

func drawLen(rng *rand.Rand, mean int) int {
	lo, hi := loLen(mean), hiLen(mean)
	return lo + rng.IntN(hi-lo+1)
}
