package frontend

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// DefaultQuantum is a class's DRR quantum, in tokens, when the file omits it.
const DefaultQuantum = 1024

// Policy is a parsed policy file: the scheduler's class configs plus what the
// frontend needs to classify requests. It is immutable after ParsePolicy and
// safe to share between goroutines.
type Policy struct {
	// Classes are the scheduler configurations, in file order.
	Classes []scheduler.ClassConfig
	// DefaultClass receives requests no hint or rule classifies.
	DefaultClass string
	// Rules are tried in order; the first match classifies.
	Rules []Rule
	// Tokenizers maps served model names to tokenizer specs (package
	// prompt: a model directory, a tokenizer.json, tiktoken:ENCODING), for
	// every replica of the cluster; a router's -tokenizer flags win.
	Tokenizers map[string]string
	// DegradedQuotas is what a replica admitting locally in a degraded
	// mode enforces of tenant quotas and class queue limits: "split" (the
	// default), "whole" or "closed" (docs/policy.md, "degraded").
	DegradedQuotas string

	defaults map[string]ClassDefaults
	sessions sessionRules // session.go; Sessions reads it
}

// The degraded quota policies a policy file may name (degraded.quotas).
const (
	DegradedQuotasSplit  = "split"
	DegradedQuotasWhole  = "whole"
	DegradedQuotasClosed = "closed"
)

// ClassDefaults are a class's request defaults, applied when the request does
// not say otherwise.
type ClassDefaults struct {
	Priority     int32
	PriorityJump float64
	Deadline     time.Duration // 0 = no deadline
}

// Rule maps requests to a class. Every non-empty condition must hold.
type Rule struct {
	Class string
	// Model is a path.Match glob on the request's model.
	Model string
	// Header and HeaderValue match a request header (HeaderValue is a glob).
	Header, HeaderValue string
	// User is a glob on the body's "user" field.
	User string
}

// policyFile is the YAML schema (docs/policy.md).
type policyFile struct {
	DefaultClass string            `yaml:"default_class"`
	Classes      []classFile       `yaml:"classes"`
	Rules        []ruleFile        `yaml:"rules"`
	Tokenizers   map[string]string `yaml:"tokenizers"`
	Degraded     degradedFile      `yaml:"degraded"`
	Sessions     sessionsFile      `yaml:"sessions"`
}

type degradedFile struct {
	Quotas string `yaml:"quotas"`
}

type classFile struct {
	Name         string     `yaml:"name"`
	Policy       string     `yaml:"policy"`
	Quantum      *int64     `yaml:"quantum"`
	Priority     int32      `yaml:"priority"`
	PriorityJump float64    `yaml:"priority_jump"`
	DeadlineMS   int64      `yaml:"deadline_ms"`
	Limits       limitsFile `yaml:"limits"`
	Busy         busyFile   `yaml:"busy"`
	// DisaggMinTokens is the class's disaggregation threshold
	// (scheduler.ClassConfig.DisaggMinTokens).
	DisaggMinTokens int `yaml:"disagg_min_tokens"`
}

type limitsFile struct {
	Requests     *int `yaml:"requests"`
	ISLTokens    *int `yaml:"isl_tokens"`
	CachedTokens *int `yaml:"cached_tokens"`
}

type busyFile struct {
	PrefillTokens  int     `yaml:"prefill_tokens"`
	DecodeFraction float64 `yaml:"decode_fraction"`
}

type ruleFile struct {
	Class string `yaml:"class"`
	Match struct {
		Model  string `yaml:"model"`
		User   string `yaml:"user"`
		Header *struct {
			Name  string `yaml:"name"`
			Value string `yaml:"value"`
		} `yaml:"header"`
	} `yaml:"match"`
}

// LoadPolicy reads and parses a policy file.
func LoadPolicy(file string) (*Policy, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	p, err := ParsePolicy(b)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", file, err)
	}
	return p, nil
}

// ParsePolicy parses and validates a policy document. Unknown keys are
// errors, so a typo never silently becomes a default.
func ParsePolicy(doc []byte) (*Policy, error) {
	var f policyFile
	dec := yaml.NewDecoder(bytes.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: policy yaml: %v", ErrBadPolicy, err)
	}
	p := &Policy{DefaultClass: f.DefaultClass, defaults: make(map[string]ClassDefaults, len(f.Classes))}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrBadPolicy}, args...)...))
	}
	for i, c := range f.Classes {
		field := fmt.Sprintf("classes[%d]", i)
		if !wire.ValidName(c.Name) {
			bad("%s.name: %q must be 1-128 characters of [A-Za-z0-9_-]", field, c.Name)
		} else if _, dup := p.defaults[c.Name]; dup {
			bad("%s.name: %q defined twice", field, c.Name)
		}
		pol := scheduler.PolicyFCFS
		if c.Policy != "" {
			var err error
			if pol, err = scheduler.ParsePolicy(c.Policy); err != nil {
				bad("%s.policy: %q is not fcfs, lcfs or wspt", field, c.Policy)
			}
		}
		quantum := int64(DefaultQuantum)
		if c.Quantum != nil {
			quantum = *c.Quantum
		}
		if c.DeadlineMS < 0 {
			bad("%s.deadline_ms: %d, must be >= 0 (0 = none)", field, c.DeadlineMS)
		}
		cc := scheduler.ClassConfig{
			Name:    c.Name,
			Quantum: quantum,
			Policy:  pol,
			Limits: scheduler.Limits{
				Requests:     limitOrUnlimited(c.Limits.Requests),
				ISLTokens:    limitOrUnlimited(c.Limits.ISLTokens),
				CachedTokens: limitOrUnlimited(c.Limits.CachedTokens),
			},
			BusyPrefillTokens:  c.Busy.PrefillTokens,
			BusyDecodeFraction: c.Busy.DecodeFraction,
			DisaggMinTokens:    c.DisaggMinTokens,
		}
		if err := cc.Validate(); err != nil {
			bad("%s (%s): %v", field, c.Name, err)
		}
		p.Classes = append(p.Classes, cc)
		p.defaults[c.Name] = ClassDefaults{
			Priority:     c.Priority,
			PriorityJump: c.PriorityJump,
			Deadline:     time.Duration(c.DeadlineMS) * time.Millisecond,
		}
	}
	if len(f.Classes) == 0 {
		bad("classes: at least one class is required")
	}
	if p.DefaultClass == "" && len(f.Classes) == 1 {
		p.DefaultClass = f.Classes[0].Name
	}
	if _, ok := p.defaults[p.DefaultClass]; !ok && len(f.Classes) > 0 {
		bad("default_class: %q is not a defined class", p.DefaultClass)
	}
	for i, r := range f.Rules {
		field := fmt.Sprintf("rules[%d]", i)
		if _, ok := p.defaults[r.Class]; !ok {
			bad("%s.class: %q is not a defined class", field, r.Class)
		}
		rule := Rule{Class: r.Class, Model: r.Match.Model, User: r.Match.User}
		if h := r.Match.Header; h != nil {
			if h.Name == "" {
				bad("%s.match.header.name: empty", field)
			}
			rule.Header, rule.HeaderValue = http.CanonicalHeaderKey(h.Name), h.Value
		}
		if rule.Model == "" && rule.User == "" && rule.Header == "" {
			bad("%s.match: needs at least one of model, user, header", field)
		}
		for _, g := range []struct{ name, glob string }{{"model", rule.Model}, {"user", rule.User}, {"header.value", rule.HeaderValue}} {
			if _, err := path.Match(g.glob, ""); err != nil {
				bad("%s.match.%s: bad pattern %q", field, g.name, g.glob)
			}
		}
		p.Rules = append(p.Rules, rule)
	}
	for name, spec := range f.Tokenizers {
		if name == "" || spec == "" {
			bad("tokenizers: %q: %q: the model name and the spec must be non-empty", name, spec)
		}
	}
	if len(f.Tokenizers) > 0 {
		p.Tokenizers = f.Tokenizers
	}
	switch p.DegradedQuotas = f.Degraded.Quotas; p.DegradedQuotas {
	case "":
		p.DegradedQuotas = DegradedQuotasSplit
	case DegradedQuotasSplit, DegradedQuotasWhole, DegradedQuotasClosed:
	default:
		bad("degraded.quotas: %q is not split, whole or closed", f.Degraded.Quotas)
	}
	p.sessions = parseSessions(f.Sessions, p, bad)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// ErrBadPolicy is wrapped by every policy file error.
var ErrBadPolicy = errors.New("frontend: bad policy")

func limitOrUnlimited(v *int) int {
	if v == nil {
		return scheduler.Unlimited
	}
	return *v
}

// DefaultPolicy is one FCFS class, "default", with no limits: what a replica
// runs when no policy file is given.
func DefaultPolicy() *Policy {
	return &Policy{
		Classes: []scheduler.ClassConfig{{
			Name:    "default",
			Quantum: DefaultQuantum,
			Policy:  scheduler.PolicyFCFS,
			Limits:  scheduler.Limits{Requests: scheduler.Unlimited, ISLTokens: scheduler.Unlimited, CachedTokens: scheduler.Unlimited},
		}},
		DefaultClass:   "default",
		DegradedQuotas: DegradedQuotasSplit,
		defaults:       map[string]ClassDefaults{"default": {}},
	}
}

// ClassNames returns the class names in file order.
func (p *Policy) ClassNames() []string {
	names := make([]string, len(p.Classes))
	for i, c := range p.Classes {
		names[i] = c.Name
	}
	return names
}

// HasClass reports whether name is a defined class.
func (p *Policy) HasClass(name string) bool {
	_, ok := p.defaults[name]
	return ok
}

// Defaults returns class's request defaults.
func (p *Policy) Defaults(class string) ClassDefaults { return p.defaults[class] }

// Classify returns the class of a request with no explicit class hint: the
// first matching rule's class, else DefaultClass.
func (p *Policy) Classify(model, user string, h http.Header) string {
	for i := range p.Rules {
		if p.Rules[i].matches(model, user, h) {
			return p.Rules[i].Class
		}
	}
	return p.DefaultClass
}

func (r *Rule) matches(model, user string, h http.Header) bool {
	if r.Model != "" && !globMatch(r.Model, model) {
		return false
	}
	if r.User != "" && !globMatch(r.User, user) {
		return false
	}
	if r.Header != "" {
		v, ok := h[r.Header]
		if !ok || len(v) == 0 {
			return false
		}
		// An empty value pattern matches any value: the header's presence is the rule.
		if r.HeaderValue != "" && !globMatch(r.HeaderValue, v[0]) {
			return false
		}
	}
	return true
}

// globMatch is path.Match with patterns validated at parse time.
func globMatch(pattern, s string) bool {
	ok, _ := path.Match(pattern, s)
	return ok
}
