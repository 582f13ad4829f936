package tenant

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// ErrInvalid marks a keys file that cannot be used; the error names what is
// wrong (never a key: the file holds only hashes).
var ErrInvalid = errors.New("tenant: invalid keys file")

// MaxWeight bounds a tenant's weight (the wire's bound too).
const MaxWeight = 1000

// Quota bounds one tenant at the owner of each class it uses. 0 is unlimited.
type Quota struct {
	Concurrent        int `yaml:"concurrent"`
	RequestsPerMinute int `yaml:"requests_per_minute"`
	TokensPerMinute   int `yaml:"tokens_per_minute"`
}

// Tenant is one tenant of the API. Values handed out by a Set are shared
// and must not be mutated.
type Tenant struct {
	ID string `yaml:"id"`
	// Keys are the SHA-256 hashes of the tenant's API keys, as "sha256:"
	// followed by 64 hex digits (switchyard keys hash prints them).
	Keys []string `yaml:"keys"`
	// Models the tenant may use; empty: every model.
	Models []string `yaml:"models"`
	// DefaultClass is the class of the tenant's requests that do not ask
	// for one by header; "": the policy classifies them.
	DefaultClass string `yaml:"default_class"`
	// Classes the tenant may ask for with x-switchyard-class (its default
	// class is always allowed). Empty: none but the default.
	Classes []string `yaml:"classes"`
	// Weight is the tenant's share of a contended class against the
	// class's other tenants (default 1).
	Weight int   `yaml:"weight"`
	Quota  Quota `yaml:"quota"`
}

// AllowsModel reports whether the tenant may use model.
func (t *Tenant) AllowsModel(model string) bool {
	return len(t.Models) == 0 || slices.Contains(t.Models, model)
}

// AllowsClass reports whether the tenant may ask for class by header.
func (t *Tenant) AllowsClass(class string) bool {
	return class == t.DefaultClass || slices.Contains(t.Classes, class)
}

// File is the keys file's YAML document.
type File struct {
	Tenants []Tenant `yaml:"tenants"`
	// Admins hold the keys of the admin routes (/metrics, /debug/*) when
	// they share the API's listener; they are not tenants and cannot use
	// the API, and no tenant key opens the admin routes.
	Admins []Admin `yaml:"admins"`
}

// Admin is one holder of an admin key (an operator, a Prometheus).
type Admin struct {
	ID string `yaml:"id"`
	// Keys are SHA-256 hashes, as Tenant.Keys.
	Keys []string `yaml:"keys"`
}

// digest is the SHA-256 of one API key.
type digest [sha256.Size]byte

// Set is an immutable, validated keys file: the key hashes of every tenant.
type Set struct {
	// byPrefix indexes the key hashes by their first eight bytes; the
	// full hash is then compared in constant time (Lookup).
	byPrefix map[uint64][]keyEntry
	tenants  []*Tenant
	// admins indexes the admin keys the same way (keyEntry.admin set).
	admins   map[uint64][]keyEntry
	adminIDs []string
}

type keyEntry struct {
	sum    digest
	tenant *Tenant
	admin  string
}

// HashKey returns the stored form of an API key: "sha256:" and the hex
// SHA-256 of the key.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Parse validates a keys file. Every problem is reported, by tenant and
// field; key hashes are named by position, never echoed.
func Parse(raw []byte) (*Set, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return build(f.Tenants, f.Admins)
}

// NewSet validates tenants and builds a Set (without admin keys).
func NewSet(tenants []Tenant) (*Set, error) { return build(tenants, nil) }

// NewSetWithAdmins validates tenants and admins and builds a Set.
func NewSetWithAdmins(tenants []Tenant, admins []Admin) (*Set, error) { return build(tenants, admins) }

func build(tenants []Tenant, admins []Admin) (*Set, error) {
	s := &Set{byPrefix: map[uint64][]keyEntry{}, admins: map[uint64][]keyEntry{}}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	ids := map[string]bool{}
	seen := map[digest]string{}
	for i := range tenants {
		t := tenants[i]
		switch {
		case !validName(t.ID):
			bad("tenants[%d].id %q: want 1-128 of [A-Za-z0-9_-]", i, t.ID)
			continue
		case ids[t.ID]:
			bad("tenants[%d].id %q: duplicate", i, t.ID)
			continue
		}
		ids[t.ID] = true
		if len(t.Keys) == 0 {
			bad("tenant %s: keys: none (a tenant without keys cannot be used)", t.ID)
		}
		if t.Weight == 0 {
			t.Weight = 1
		}
		if t.Weight < 1 || t.Weight > MaxWeight {
			bad("tenant %s: weight %d: want 1..%d", t.ID, t.Weight, MaxWeight)
		}
		if t.Quota.Concurrent < 0 || t.Quota.RequestsPerMinute < 0 || t.Quota.TokensPerMinute < 0 {
			bad("tenant %s: quota: negative values (0 is unlimited)", t.ID)
		}
		if t.DefaultClass != "" && !validName(t.DefaultClass) {
			bad("tenant %s: default_class %q: not a class name", t.ID, t.DefaultClass)
		}
		for _, c := range t.Classes {
			if !validName(c) {
				bad("tenant %s: classes: %q is not a class name", t.ID, c)
			}
		}
		for _, m := range t.Models {
			if m == "" {
				bad("tenant %s: models: empty name", t.ID)
			}
		}
		tp := &t
		for k, h := range t.Keys {
			sum, err := parseHash(h)
			if err != nil {
				bad("tenant %s: keys[%d]: %v", t.ID, k, err)
				continue
			}
			if other, dup := seen[sum]; dup {
				bad("tenant %s: keys[%d]: the same key hash is also listed for tenant %s", t.ID, k, other)
				continue
			}
			seen[sum] = t.ID
			p := binary.LittleEndian.Uint64(sum[:8])
			s.byPrefix[p] = append(s.byPrefix[p], keyEntry{sum: sum, tenant: tp})
		}
		s.tenants = append(s.tenants, tp)
	}
	adminIDs := map[string]bool{}
	for i, a := range admins {
		switch {
		case !validName(a.ID):
			bad("admins[%d].id %q: want 1-128 of [A-Za-z0-9_-]", i, a.ID)
			continue
		case adminIDs[a.ID]:
			bad("admins[%d].id %q: duplicate", i, a.ID)
			continue
		}
		adminIDs[a.ID] = true
		if len(a.Keys) == 0 {
			bad("admin %s: keys: none", a.ID)
		}
		for k, h := range a.Keys {
			sum, err := parseHash(h)
			if err != nil {
				bad("admin %s: keys[%d]: %v", a.ID, k, err)
				continue
			}
			if other, dup := seen[sum]; dup {
				// One key for the API and the admin routes would hand
				// the cluster view to whoever holds a client's key.
				bad("admin %s: keys[%d]: the same key hash is also listed for %s", a.ID, k, other)
				continue
			}
			seen[sum] = "admin " + a.ID
			p := binary.LittleEndian.Uint64(sum[:8])
			s.admins[p] = append(s.admins[p], keyEntry{sum: sum, admin: a.ID})
		}
		s.adminIDs = append(s.adminIDs, a.ID)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
	}
	return s, nil
}

// parseHash reads "sha256:<64 hex digits>".
func parseHash(h string) (digest, error) {
	var d digest
	hexPart, ok := strings.CutPrefix(strings.TrimSpace(h), "sha256:")
	if !ok {
		return d, errors.New(`want "sha256:" and 64 hex digits (switchyard keys hash); a plain key must not be stored`)
	}
	if len(hexPart) != 2*sha256.Size {
		return d, fmt.Errorf("want 64 hex digits after sha256:, got %d characters", len(hexPart))
	}
	if _, err := hex.Decode(d[:], []byte(hexPart)); err != nil {
		return d, errors.New("the digits after sha256: are not hex")
	}
	return d, nil
}

// Lookup returns the tenant whose key this is. The key is hashed first; the
// index is searched with the hash's first eight bytes (timing then depends
// only on the hash, which tells nothing about other keys) and the full hash
// is compared in constant time.
func (s *Set) Lookup(key string) (*Tenant, bool) {
	if s == nil || key == "" {
		return nil, false
	}
	sum := sha256.Sum256([]byte(key))
	var found *Tenant
	for _, e := range s.byPrefix[binary.LittleEndian.Uint64(sum[:8])] {
		if subtle.ConstantTimeCompare(e.sum[:], sum[:]) == 1 {
			found = e.tenant
		}
	}
	return found, found != nil
}

// LookupAdmin returns the admin whose key this is, with Lookup's
// constant-time comparison. A tenant's key is never an admin's.
func (s *Set) LookupAdmin(key string) (string, bool) {
	if s == nil || key == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(key))
	found := ""
	for _, e := range s.admins[binary.LittleEndian.Uint64(sum[:8])] {
		if subtle.ConstantTimeCompare(e.sum[:], sum[:]) == 1 {
			found = e.admin
		}
	}
	return found, found != ""
}

// Admins returns the admins' ids, in file order.
func (s *Set) Admins() []string {
	if s == nil {
		return nil
	}
	return s.adminIDs
}

// Tenants returns the tenants, in file order.
func (s *Set) Tenants() []*Tenant {
	if s == nil {
		return nil
	}
	return s.tenants
}

// Keys returns how many key hashes the set holds.
func (s *Set) Keys() int {
	if s == nil {
		return 0
	}
	n := 0
	for _, es := range s.byPrefix {
		n += len(es)
	}
	return n
}

// validName is the wire's name rule (class and tenant names travel in NATS
// messages and subjects).
func validName(s string) bool {
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
