package spec

import (
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Grant lets a sandbox use one secret on matching requests to one host.
// The sandbox holds only a placeholder (Token, in the variable Env); the
// egress proxy, which terminates TLS for Host alone, puts the real value in
// Header, on requests matching Allow, and nowhere else.
type Grant struct {
	Secret   string        `json:"secret"`
	Env      string        `json:"env"`
	Host     string        `json:"host"`
	Port     int           `json:"port"`
	Header   string        `json:"header"`
	Scheme   string        `json:"scheme"` // bearer, token, basic or raw
	Username string        `json:"username,omitempty"`
	Allow    []string      `json:"allow"`
	TTL      time.Duration `json:"ttl,omitempty"` // 0: the sandbox's lifetime
	// Token is the placeholder the broker minted; set at creation.
	Token string `json:"token,omitempty"`
}

// Grant schemes: how the credential is written in its header.
var GrantSchemes = []string{"bearer", "token", "basic", "raw"}

// Methods a grant may name.
var grantMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// MaxGrants caps the grants of one sandbox.
const MaxGrants = 32

// SecretNameOK reports whether n may name a secret: 1–64 of a-z 0-9 . _ -,
// starting with a letter or digit.
func SecretNameOK(n string) bool {
	if n == "" || len(n) > 64 || n[0] == '.' || n[0] == '_' || n[0] == '-' {
		return false
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// GrantEnv is the default variable of a grant's placeholder:
// AIRLOCK_GRANT_<SECRET> in upper case, other characters as _.
func GrantEnv(secret string) string {
	b := []byte("AIRLOCK_GRANT_" + strings.ToUpper(secret))
	for i, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// Headers a grant may not write: the proxy owns them.
var reservedHeaders = []string{"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive", "proxy-authorization", "proxy-connection", "cookie"}

func headerNameOK(h string) bool {
	if h == "" || len(h) > 64 || slices.Contains(reservedHeaders, strings.ToLower(h)) {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// grantHostOK: an exact DNS name (no wildcard, no IP literal), lower case.
func grantHostOK(h string) bool {
	if h == "" || len(h) > 253 || !strings.Contains(h, ".") {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if !hostnameOK(label) {
			return false
		}
	}
	last := h[strings.LastIndexByte(h, '.')+1:]
	return strings.ContainsFunc(last, func(r rune) bool { return r < '0' || r > '9' })
}

// validateGrants fills defaults and checks every grant.
func (s *Spec) validateGrants() error {
	if len(s.Grants) > MaxGrants {
		return errdefs.Invalid(fmt.Sprintf("at most %d grants per sandbox", MaxGrants))
	}
	envs := map[string]bool{}
	for _, kv := range s.Env {
		k, _, _ := strings.Cut(kv, "=")
		envs[k] = true
	}
	for i := range s.Grants {
		g := &s.Grants[i]
		bad := func(format string, a ...any) error {
			return errdefs.Invalid(fmt.Sprintf("grant %d (secret %q): ", i+1, g.Secret) + fmt.Sprintf(format, a...))
		}
		if !SecretNameOK(g.Secret) {
			return bad("secret names are 1-64 of a-z, 0-9, '.', '_' and '-'")
		}
		if g.Env == "" {
			g.Env = GrantEnv(g.Secret)
		}
		if !envKeyOK(g.Env) {
			return bad("env %q: not a variable name", g.Env)
		}
		if envs[g.Env] && g.Token == "" {
			return bad("env %s is already set; a grant's placeholder needs a variable of its own", g.Env)
		}
		envs[g.Env] = true
		g.Host = strings.TrimSuffix(strings.ToLower(g.Host), ".")
		if !grantHostOK(g.Host) {
			return bad("host %q: must be an exact DNS name (no wildcard, no IP address)", g.Host)
		}
		if g.Port == 0 {
			g.Port = 443
		}
		if g.Port < 1 || g.Port > 65535 {
			return bad("port %d out of range", g.Port)
		}
		if g.Header == "" {
			g.Header = "Authorization"
		}
		if !headerNameOK(g.Header) {
			return bad("header %q: not a header name a grant may write", g.Header)
		}
		if g.Scheme == "" {
			g.Scheme = "bearer"
		}
		if !slices.Contains(GrantSchemes, g.Scheme) {
			return bad("scheme %q: must be one of %s", g.Scheme, strings.Join(GrantSchemes, ", "))
		}
		if g.Scheme == "basic" && !strings.EqualFold(g.Header, "Authorization") {
			return bad("scheme basic goes in the Authorization header")
		}
		if strings.ContainsAny(g.Username, ":\r\n\x00") || len(g.Username) > 256 {
			return bad("username: no ':' or control characters, at most 256 bytes")
		}
		if len(g.Allow) == 0 || len(g.Allow) > 64 {
			return bad("allow: 1 to 64 request rules such as \"GET,HEAD /repos/acme/shop/**\"")
		}
		for _, a := range g.Allow {
			if _, err := ParseRequestRule(a); err != nil {
				return bad("%v", err)
			}
		}
		if g.TTL < 0 || g.TTL > 7*24*time.Hour {
			return bad("ttl %v out of range", g.TTL)
		}
	}
	return nil
}

// RequestRule is one "METHODS PATH[?QUERY]" of a grant: the methods it
// covers, the path pattern's segments ("*" one segment, a final "**" any
// number), and query parameters the request must carry with exactly these
// values.
type RequestRule struct {
	Methods  []string
	Segments []string
	Query    url.Values
}

// ParseRequestRule parses "GET,HEAD /repos/acme/shop/**" or
// "GET /acme/shop.git/info/refs?service=git-upload-pack".
func ParseRequestRule(s string) (RequestRule, error) {
	var r RequestRule
	methods, target, ok := strings.Cut(strings.TrimSpace(s), " ")
	target = strings.TrimSpace(target)
	if !ok || methods == "" || target == "" || len(s) > 1024 {
		return r, fmt.Errorf("allow %q: want \"METHOD[,METHOD] /path\"", s)
	}
	for _, m := range strings.Split(methods, ",") {
		if !slices.Contains(grantMethods, m) {
			return r, fmt.Errorf("allow %q: method %q is not one of %s", s, m, strings.Join(grantMethods, " "))
		}
		if !slices.Contains(r.Methods, m) {
			r.Methods = append(r.Methods, m)
		}
	}
	p, q, hasQuery := strings.Cut(target, "?")
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, " %\\") || path.Clean(p) != p {
		return r, fmt.Errorf("allow %q: the path must be absolute and clean, without escapes", s)
	}
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	if p == "/" {
		segs = nil
	}
	for i, seg := range segs {
		if !segmentOK(seg) {
			return r, fmt.Errorf("allow %q: segment %q: a granted path is printable ASCII without ';', and no segment is only dots", s, seg)
		}
		if seg == "**" && i != len(segs)-1 {
			return r, fmt.Errorf("allow %q: \"**\" may only end the path", s)
		}
		if strings.Contains(seg, "*") && seg != "*" && seg != "**" {
			return r, fmt.Errorf("allow %q: '*' stands for a whole segment", s)
		}
	}
	r.Segments = segs
	if hasQuery {
		v, err := url.ParseQuery(q)
		if err != nil || len(v) == 0 {
			return r, fmt.Errorf("allow %q: bad query", s)
		}
		for k, vs := range v {
			if len(vs) != 1 {
				return r, fmt.Errorf("allow %q: query parameter %q given twice", s, k)
			}
		}
		r.Query = v
	}
	return r, nil
}

// Matches reports whether a request with method and URL u falls under the
// rule. The path is compared segment by segment after decoding; a path
// that is not in normal form (see NormalPath) never matches, so that no
// server can read it differently from the proxy.
func (r RequestRule) Matches(method string, u *url.URL) bool {
	if !slices.Contains(r.Methods, method) {
		return false
	}
	segs, ok := NormalPath(u)
	if !ok {
		return false
	}
	n := len(r.Segments)
	switch {
	case n > 0 && r.Segments[n-1] == "**":
		if len(segs) < n-1 {
			return false
		}
		n--
	case len(segs) != n:
		return false
	}
	for i := 0; i < n; i++ {
		if r.Segments[i] != "*" && r.Segments[i] != segs[i] || segs[i] == "" {
			return false
		}
	}
	if r.Query != nil {
		got, err := url.ParseQuery(u.RawQuery)
		if err != nil {
			return false
		}
		for k, want := range r.Query {
			if vs := got[k]; len(vs) != 1 || vs[0] != want[0] {
				return false
			}
		}
	}
	return true
}

// notNormal are what a path in normal form never holds, before decoding,
// each a way for a server to read a path differently from the proxy.
var notNormal = []string{
	"%2f", // an encoded slash: one segment here, two there
	"%5c", // an encoded backslash: a separator on some servers
	"\\",  // a backslash: the same
	"%2e", // an encoded dot: ".." after the server decodes it
	"%25", // an encoded '%': "%252e" is "%2e" after one decoding, ".." after two
	"%00", // NUL: the end of the path in C
}

// segmentOK: a decoded segment of a path in normal form is printable
// ASCII (an overlong "%c0%ae", a fullwidth "．" or a "‥" is a dot to some
// server), has no ';' ("..;x" is ".." to servers that cut path
// parameters), and is not dots and blanks alone ("...", ".. ", ". ." are
// ".." to servers that trim them).
func segmentOK(seg string) bool {
	for i := 0; i < len(seg); i++ {
		if c := seg[i]; c < 0x20 || c > 0x7e || c == ';' {
			return false
		}
	}
	return !strings.Contains(seg, ".") || strings.Trim(seg, " \t.") != ""
}

// NormalPath returns the decoded segments of u's path, or false when the
// path is not in normal form: an opaque URL, dot segments and empty
// segments, anything of notNormal, or a segment segmentOK refuses.
func NormalPath(u *url.URL) ([]string, bool) {
	if u.Opaque != "" {
		// "GET https:x/y" has no path: it is sent on as "GET x/y".
		return nil, false
	}
	raw := u.EscapedPath()
	if raw == "" {
		raw = "/"
	}
	low := strings.ToLower(raw)
	if !strings.HasPrefix(raw, "/") {
		return nil, false
	}
	for _, s := range notNormal {
		if strings.Contains(low, s) {
			return nil, false
		}
	}
	p, err := url.PathUnescape(raw)
	if err != nil {
		return nil, false
	}
	trimmed := p
	if len(p) > 1 {
		trimmed = strings.TrimSuffix(p, "/")
	}
	if path.Clean(trimmed) != trimmed {
		return nil, false
	}
	if trimmed == "/" {
		return nil, true
	}
	segs := strings.Split(trimmed[1:], "/")
	for _, s := range segs {
		if !segmentOK(s) {
			return nil, false
		}
	}
	return segs, true
}
