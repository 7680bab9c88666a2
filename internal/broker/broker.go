// Package broker keeps credentials out of sandboxes. A tenant's secrets
// are sealed at rest (internal/broker/keys: AES-256-GCM under a key file
// no sandbox can reach) and opened only in the daemon. A sandbox gets
// grants: for each, a placeholder token (signed, bound to the sandbox and
// the grant, expiring) in an environment variable, a CA of its own that
// only vouches for the granted hosts, and an egress proxy that terminates
// TLS for those hosts alone and puts the real credential in the grant's
// header only on requests the grant covers. A placeholder anywhere else is
// stripped and recorded; every token of a sandbox is revoked when it ends.
// The same door scans what it can read for credentials (internal/scan).
package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/scan"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// Config configures a broker.
type Config struct {
	Keys *keys.Keys
	// Dir keeps live sandboxes' CAs for a restarted daemon; "" keeps them
	// in memory (airlock run).
	Dir string
	// Secret returns the current value of tenant's secret name.
	Secret func(tenant, name string) ([]byte, error)
	Now    func() time.Time
}

// Broker mints, verifies and revokes tokens and makes sessions.
type Broker struct {
	cfg  Config
	mu   sync.Mutex
	live map[string]map[string]bool // sandbox → ids of its tokens in force
}

// New makes a broker.
func New(cfg Config) *Broker {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Secret == nil {
		cfg.Secret = func(_, name string) ([]byte, error) {
			return nil, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("secret %q not found", name))
		}
	}
	return &Broker{cfg: cfg, live: map[string]map[string]bool{}}
}

// Keys are the broker's keys (sealing, fingerprints).
func (b *Broker) Keys() *keys.Keys { return b.cfg.Keys }

// Mint makes a token for grant gi of sandbox id, good until exp (zero:
// until the sandbox ends and its tokens are revoked).
func (b *Broker) Mint(id string, gi int, g *spec.Grant, exp time.Time) string {
	c := Claims{Sandbox: id, Grant: gi, Audience: fmt.Sprintf("%s:%d", g.Host, g.Port), Scope: slices.Clone(g.Allow), ID: newTokenID()}
	if !exp.IsZero() {
		c.Expires = exp.Unix()
	}
	b.register(id, c.ID)
	return mintToken(b.cfg.Keys, c)
}

func (b *Broker) register(id, jti string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.live[id] == nil {
		b.live[id] = map[string]bool{}
	}
	b.live[id][jti] = true
}

// Verify checks token tok presented by sandbox id: signed by this broker,
// not revoked, issued to id, not expired. The scope is the caller's to
// check (Claims.Allows).
func (b *Broker) Verify(tok, id string) (*Claims, error) {
	c, err := parseToken(b.cfg.Keys, tok)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	live := b.live[c.Sandbox][c.ID]
	b.mu.Unlock()
	switch {
	case !live:
		return c, ErrRevoked
	case c.Sandbox != id:
		return c, ErrOtherSandbox
	case c.expired(b.cfg.Now()):
		return c, ErrExpired
	}
	return c, nil
}

// Revoke ends every token of sandbox id.
func (b *Broker) Revoke(id string) {
	b.mu.Lock()
	delete(b.live, id)
	b.mu.Unlock()
}

// End revokes sandbox id's tokens and removes its CA.
func (b *Broker) End(id string) {
	b.Revoke(id)
	if b.cfg.Dir != "" {
		_ = os.RemoveAll(filepath.Join(b.cfg.Dir, id))
	}
}

// caLifetime is how long a sandbox's CA and its certificates are valid.
const caLifetime = 365 * 24 * time.Hour

// Sweep removes the CAs of sandboxes not in live (ended while no daemon
// ran).
func (b *Broker) Sweep(live []string) {
	if b.cfg.Dir == "" {
		return
	}
	ents, _ := os.ReadDir(b.cfg.Dir)
	for _, e := range ents {
		if !slices.Contains(live, e.Name()) {
			_ = os.RemoveAll(filepath.Join(b.cfg.Dir, e.Name()))
		}
	}
}

// Session prepares sandbox id's egress door. At creation (adopt false) it
// mints each grant's token into s (Grants[i].Token and the grant's
// variable in Env) and makes the sandbox's CA; at adoption it takes back
// the tokens s holds and the CA kept in Dir.
func (b *Broker) Session(id string, s *spec.Spec, adopt bool) (*Session, error) {
	ss := &Session{b: b, id: id, tenant: s.Tenant, grants: s.Grants, policy: s.Scan}
	if len(s.Grants) == 0 {
		return ss, nil
	}
	hosts := []string{}
	for _, g := range s.Grants {
		if !slices.Contains(hosts, g.Host) {
			hosts = append(hosts, g.Host)
		}
	}
	now := b.cfg.Now()
	if adopt {
		for _, g := range s.Grants {
			c, err := parseToken(b.cfg.Keys, g.Token)
			if err != nil {
				return nil, fmt.Errorf("grant %s: its token: %w", g.Secret, err)
			}
			b.register(id, c.ID)
		}
		dir := filepath.Join(b.cfg.Dir, id)
		certPEM, err1 := os.ReadFile(filepath.Join(dir, "ca.pem"))
		keyPEM, err2 := os.ReadFile(filepath.Join(dir, "ca.key"))
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("sandbox CA: %w", err)
		}
		ca, err := LoadCA(certPEM, keyPEM)
		if err != nil {
			return nil, err
		}
		ss.ca = ca
		return ss, nil
	}
	for i := range s.Grants {
		g := &s.Grants[i]
		if _, err := b.cfg.Secret(s.Tenant, g.Secret); err != nil {
			return nil, err
		}
		// Without a TTL of its own a placeholder lives as long as its
		// sandbox, however often that is extended: it is revoked when the
		// sandbox ends. A TTL past the sandbox's end changes nothing.
		var exp time.Time
		if g.TTL > 0 && g.TTL < s.Timeout {
			exp = now.Add(g.TTL)
		}
		g.Token = b.Mint(id, i, g, exp)
		s.Env = append(s.Env, g.Env+"="+g.Token)
	}
	// The CA outlives any TTL (a sandbox may be extended); its key is
	// removed with the sandbox.
	ca, err := NewCA(id, hosts, now.Add(caLifetime))
	if err != nil {
		return nil, err
	}
	if b.cfg.Dir != "" {
		dir := filepath.Join(b.cfg.Dir, id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if err := errors.Join(os.WriteFile(filepath.Join(dir, "ca.pem"), ca.PEM(), 0o600), os.WriteFile(filepath.Join(dir, "ca.key"), ca.KeyPEM(), 0o600)); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("sandbox CA: %w", err)
		}
	}
	ss.ca = ca
	return ss, nil
}

// Scan returns the credentials in text, leaving out airlock's own
// placeholders (worthless by design, and handled by the proxy): they are
// blanked before the rules run, offsets kept. Besides, a long run of
// word characters is the costliest input of the generic rule.
func (b *Broker) Scan(text string) ([]scan.Finding, error) {
	sc, err := scan.Default()
	if err != nil {
		return nil, err
	}
	if locs := Placeholders(text); len(locs) > 0 {
		blank := []byte(text)
		for _, l := range locs {
			for i := l[0]; i < l[1]; i++ {
				blank[i] = ' '
			}
		}
		text = string(blank)
	}
	return sc.Scan(text), nil
}

// Part is one value of a call or request, scanned with the others.
// Prefix (a header's "Name: ") is scanned with it, for context, but is
// not part of it.
type Part struct {
	Prefix, Text string
}

// PartFinding is a finding in part Part, its offsets local to that part's
// text (clipped to it).
type PartFinding struct {
	Part int
	scan.Finding
}

// ScanParts scans parts in one pass, joined by sep: a credential split
// from its name across parts ("--token", "ghp_...") is still found, and
// the rules' cost is paid once.
func (b *Broker) ScanParts(parts []Part, sep byte) ([]PartFinding, error) {
	var sb strings.Builder
	begins := make([]int, len(parts)) // where each part's prefix begins
	starts := make([]int, len(parts)) // and its text
	for i, p := range parts {
		if i > 0 {
			sb.WriteByte(sep)
		}
		begins[i] = sb.Len()
		sb.WriteString(p.Prefix)
		starts[i] = sb.Len()
		sb.WriteString(p.Text)
	}
	fs, err := b.Scan(sb.String())
	if err != nil {
		return nil, err
	}
	var out []PartFinding
	for _, f := range fs {
		i := max(0, sort.SearchInts(begins, f.Start+1)-1)
		f.Start = max(0, f.Start-starts[i])
		f.End = min(f.End-starts[i], len(parts[i].Text))
		if f.End > f.Start {
			out = append(out, PartFinding{Part: i, Finding: f})
		}
	}
	return out, nil
}

// RedactParts replaces every finding's secret in its part's text.
func RedactParts(texts []string, fs []PartFinding) {
	by := map[int][]scan.Finding{}
	for _, f := range fs {
		by[f.Part] = append(by[f.Part], f.Finding)
	}
	for i, local := range by {
		texts[i] = scan.Redact(texts[i], local)
	}
}

// Redacted is a copy of texts with every credential the scanner finds
// (scanned in one pass, joined by newlines) replaced by
// [REDACTED:rule], and the findings, for a record that must not keep
// the values.
func (b *Broker) Redacted(texts []string) ([]string, []PartFinding, error) {
	parts := make([]Part, len(texts))
	for i, t := range texts {
		parts[i] = Part{Text: t}
	}
	fs, err := b.ScanParts(parts, '\n')
	if err != nil {
		return nil, nil, err
	}
	out := slices.Clone(texts)
	RedactParts(out, fs)
	return out, fs, nil
}

// Placeholders finds what looks like a token in text (offsets).
func Placeholders(text string) [][]int {
	if !strings.Contains(text, TokenPrefix) {
		return nil
	}
	return tokenPattern().FindAllStringIndex(text, -1)
}
