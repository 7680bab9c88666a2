package broker

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/url"
	"sort"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// PlaceholderRule names findings of airlock's own placeholders.
const PlaceholderRule = "airlock-placeholder"

// Session is one sandbox's door: the egress.Inspector its proxy asks.
type Session struct {
	b      *Broker
	id     string
	tenant string
	grants []spec.Grant
	ca     *CA
	policy string // block, redact, record; "" scans nothing
}

var _ egress.Inspector = (*Session)(nil)

// CAPEM is the certificate the sandbox must trust (nil without grants).
func (s *Session) CAPEM() []byte {
	if s.ca == nil {
		return nil
	}
	return s.ca.PEM()
}

// Intercepts reports whether host:port has a grant.
func (s *Session) Intercepts(host string, port int) bool {
	for _, g := range s.grants {
		if g.Host == host && g.Port == port {
			return true
		}
	}
	return false
}

// Certificate is host's certificate under the sandbox's CA.
func (s *Session) Certificate(host string) (*tls.Certificate, error) {
	if s.ca == nil {
		return nil, fmt.Errorf("no grant for %s", host)
	}
	return s.ca.Leaf(host)
}

// Inspect scans one request the proxy can read for credentials (by the
// sandbox's policy), puts a grant's credential in its header when the
// request is one the grant covers, and strips every other placeholder.
func (s *Session) Inspect(in *egress.Inspected) egress.Verdict {
	var v egress.Verdict
	if s.policy != "" {
		if refuse := s.scan(in, &v); refuse != "" {
			v.Refuse = refuse
			return v
		}
	}
	// A placeholder in the URL is stripped before any grant judges the
	// URL: stripping after the judgement would send a path or query the
	// grant never saw ("/shop/.<placeholder>./x" becomes "/shop/../x").
	if u := in.Req.URL; u != nil {
		for _, part := range []*string{&u.Path, &u.RawPath, &u.RawQuery} {
			if locs := Placeholders(*part); len(locs) > 0 {
				for _, l := range locs {
					v.Findings = append(v.Findings, s.placeholder((*part)[l[0]:l[1]], "url", "placeholder outside its grant"))
				}
				*part = tokenPattern().ReplaceAllString(*part, "")
			}
		}
	}
	swapped := ""
	for gi := range s.grants {
		g := &s.grants[gi]
		if g.Host != in.Host || g.Port != in.Port {
			continue
		}
		tok, user, ok := fromHeader(g, in.Req.Header.Get(g.Header))
		if !ok {
			continue
		}
		where := "header " + g.Header
		c, err := s.b.Verify(tok, s.id)
		switch {
		case err != nil:
		case c.Grant != gi:
			continue // another grant's placeholder: that grant decides
		case !in.TLS:
			err = fmt.Errorf("not over TLS")
		case !c.Allows(in.Host, in.Port, in.Req.Method, in.Req.URL):
			err = fmt.Errorf("%w: %s %s is not in grant %s's rules", ErrOutOfScope, in.Req.Method, in.Req.URL.EscapedPath(), g.Secret)
		case methodOverride(in) != "":
			err = fmt.Errorf("%w: %s asks the server for another method than %s", ErrOutOfScope, methodOverride(in), in.Req.Method)
		}
		if err != nil {
			in.Req.Header.Del(g.Header)
			v.Findings = append(v.Findings, s.placeholder(tok, where, "placeholder refused: "+err.Error()))
			continue
		}
		secret, err := s.b.cfg.Secret(s.tenant, g.Secret)
		if err != nil {
			in.Req.Header.Del(g.Header)
			v.Refuse = fmt.Sprintf("grant %s: its secret is unavailable (%v)", g.Secret, err)
			return v
		}
		in.Req.Header.Set(g.Header, credential(g, string(secret), user))
		v.Grant, swapped = g.Secret, strings.ToLower(g.Header)
		break
	}
	// Anywhere else a placeholder is worthless, and stripped.
	for name, vals := range in.Req.Header {
		if strings.ToLower(name) == swapped {
			continue
		}
		var kept []string
		for _, val := range vals {
			text := val
			if strings.EqualFold(name, "Authorization") || strings.EqualFold(name, "Proxy-Authorization") {
				text += " " + basicDecoded(val)
			}
			locs := Placeholders(text)
			for _, l := range locs {
				v.Findings = append(v.Findings, s.placeholder(text[l[0]:l[1]], "header "+name, "placeholder outside its grant"))
			}
			if len(locs) == 0 {
				kept = append(kept, val)
			}
		}
		if len(kept) == 0 {
			in.Req.Header.Del(name)
		} else {
			in.Req.Header[name] = kept
		}
	}
	if locs := Placeholders(string(in.Body)); len(locs) > 0 {
		for _, l := range locs {
			v.Findings = append(v.Findings, s.placeholder(string(in.Body[l[0]:l[1]]), "body", "placeholder outside its grant"))
		}
		in.Body = tokenPattern().ReplaceAll(in.Body, nil)
	}
	return v
}

// Redact is the record's scan: every credential the scanner finds in
// texts, and every placeholder, is replaced by [REDACTED:rule] and named
// by a finding (its keyed fingerprint), whatever the scan policy (under
// record the request goes on unchanged; its record does not keep the
// value). A scanner that cannot run leaves nothing of the texts.
func (s *Session) Redact(texts, where []string) []eventlog.Finding {
	red, fs, err := s.b.Redacted(texts)
	if err != nil {
		for i := range texts {
			texts[i] = "[REDACTED: the secret scanner is unavailable]"
		}
		return nil
	}
	copy(texts, red)
	const why = "redacted in the record"
	var out []eventlog.Finding
	for _, f := range fs {
		out = append(out, eventlog.Finding{Rule: f.Rule, Fingerprint: s.b.cfg.Keys.Fingerprint(f.Secret), Where: where[f.Part], Action: "redacted", Reason: why})
	}
	for i := range texts {
		locs := Placeholders(texts[i])
		for _, l := range locs {
			out = append(out, eventlog.Finding{Rule: PlaceholderRule, Fingerprint: s.b.cfg.Keys.Fingerprint(texts[i][l[0]:l[1]]), Where: where[i], Action: "redacted", Reason: why})
		}
		if len(locs) > 0 {
			texts[i] = tokenPattern().ReplaceAllString(texts[i], "[REDACTED:"+PlaceholderRule+"]")
		}
	}
	return out
}

func (s *Session) placeholder(tok, where, reason string) eventlog.Finding {
	return eventlog.Finding{Rule: PlaceholderRule, Fingerprint: s.b.cfg.Keys.Fingerprint(tok), Where: where, Action: "stripped", Reason: reason}
}

// scan applies the secret scanner to the request's headers, URL and body
// (one pass over all of them); it returns a refusal under the block
// policy.
func (s *Session) scan(in *egress.Inspected, v *egress.Verdict) string {
	act := map[string]string{"block": "blocked", "redact": "redacted", "record": "recorded"}[s.policy]
	// What is read, one line each: "Name: value" per header value, the
	// path, the query, and the body's start (the generic rule costs ~2 µs
	// a byte on the worst input, which the daemon pays, not the sandbox).
	var where []string
	var vals []*string
	names := make([]string, 0, len(in.Req.Header))
	for name := range in.Req.Header {
		names = append(names, name)
	}
	sort.Strings(names)
	var parts []Part
	for _, name := range names {
		hv := in.Req.Header[name]
		for i := range hv {
			parts, where, vals = append(parts, Part{name + ": ", hv[i]}), append(where, "header "+name), append(vals, &hv[i])
		}
	}
	if u := in.Req.URL; u != nil {
		for _, p := range []*string{&u.Path, &u.RawQuery} {
			parts, where, vals = append(parts, Part{"", *p}), append(where, "url"), append(vals, p)
		}
	}
	body := string(in.Body[:min(len(in.Body), MaxScanBody)])
	parts, where, vals = append(parts, Part{"", body}), append(where, "body"), append(vals, &body)
	fs, err := s.b.ScanParts(parts, '\n')
	if err != nil {
		return "the secret scanner is unavailable: " + err.Error()
	}
	if len(fs) == 0 {
		return ""
	}
	for _, f := range fs {
		v.Findings = append(v.Findings, eventlog.Finding{Rule: f.Rule, Fingerprint: s.b.cfg.Keys.Fingerprint(f.Secret), Where: where[f.Part], Action: act})
	}
	if s.policy == "block" || s.policy == "redact" {
		// Redacted under block too: the request is refused, but the
		// record of it shows its path.
		texts := make([]string, len(vals))
		for i, p := range vals {
			texts[i] = *p
		}
		RedactParts(texts, fs)
		for i, p := range vals {
			*p = texts[i]
		}
		if in.Req.URL != nil {
			in.Req.URL.RawPath = ""
		}
		in.Body = append([]byte(body), in.Body[min(len(in.Body), MaxScanBody):]...)
	}
	if s.policy == "block" {
		f := v.Findings[0]
		return fmt.Sprintf("secret scan: the request's %s holds what looks like a credential (rule %s, fingerprint %s); this sandbox's policy blocks it", f.Where, f.Rule, f.Fingerprint)
	}
	return ""
}

// MaxScanBody is how much of a request body the secret scanner reads.
const MaxScanBody = 64 << 10

// fromHeader reads the placeholder out of a grant's header value, the way
// its scheme writes it (for basic: the password, or else the user name).
func fromHeader(g *spec.Grant, val string) (tok, user string, ok bool) {
	val = strings.TrimSpace(val)
	rest := val
	switch g.Scheme {
	case "bearer":
		if len(val) < 7 || !strings.EqualFold(val[:7], "bearer ") {
			return "", "", false
		}
		rest = strings.TrimSpace(val[7:])
	case "token":
		if len(val) < 6 || !strings.EqualFold(val[:6], "token ") {
			return "", "", false
		}
		rest = strings.TrimSpace(val[6:])
	case "basic":
		u, p, ok := strings.Cut(basicDecoded(val), ":")
		if !ok {
			return "", "", false
		}
		if isToken(p) {
			return p, u, true
		}
		if isToken(u) {
			return u, "", true
		}
		return "", "", false
	}
	return rest, "", isToken(rest)
}

func isToken(s string) bool {
	l := tokenPattern().FindStringIndex(s)
	return l != nil && l[0] == 0 && l[1] == len(s)
}

func basicDecoded(val string) string {
	val = strings.TrimSpace(val)
	if len(val) < 6 || !strings.EqualFold(val[:6], "basic ") {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(val[6:]))
	if err != nil {
		return ""
	}
	return string(b)
}

// credential writes secret the way the grant's scheme says.
func credential(g *spec.Grant, secret, clientUser string) string {
	switch g.Scheme {
	case "bearer":
		return "Bearer " + secret
	case "token":
		return "token " + secret
	case "basic":
		user := g.Username
		if user == "" {
			user = clientUser
		}
		if user == "" {
			user = "x-access-token"
		}
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+secret))
	}
	return secret
}

// overrideHeaders are the headers through which common servers and
// frameworks (Google APIs, Laravel, Express's method-override, ...) let a
// request stand for another method.
var overrideHeaders = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// methodOverride names what in a request asks the server to treat it as
// another method (a header, or a "_method" parameter of the query or of a
// form body, as Rails, Laravel and Spring read it); "" when nothing does.
// A grant covers the request's own method only, so such a request gets
// no credential.
func methodOverride(in *egress.Inspected) string {
	for _, h := range overrideHeaders {
		if _, ok := in.Req.Header[h]; ok {
			return "header " + h
		}
	}
	if u := in.Req.URL; u != nil && u.RawQuery != "" {
		if q, err := url.ParseQuery(u.RawQuery); err != nil || q.Has("_method") {
			return "the query's _method"
		}
	}
	ct := strings.ToLower(in.Req.Header.Get("Content-Type"))
	switch {
	case strings.HasPrefix(ct, "application/x-www-form-urlencoded"):
		if q, err := url.ParseQuery(string(in.Body)); !in.Complete || err != nil || q.Has("_method") {
			return "a form's _method"
		}
	case strings.HasPrefix(ct, "multipart/"):
		if !in.Complete || multipartNames(in.Req.Header.Get("Content-Type"), in.Body, func(n string) bool {
			return strings.Contains(strings.ToLower(n), "method")
		}) {
			return "a form's _method"
		}
	}
	return ""
}

// multipartNames reports whether a part of a multipart body has a name
// hit accepts, or the body does not parse.
func multipartNames(ct string, body []byte, hit func(string) bool) bool {
	_, params, err := mime.ParseMediaType(ct)
	if err != nil || params["boundary"] == "" {
		return true
	}
	r := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		part, err := r.NextRawPart()
		if err == io.EOF {
			return false
		}
		if err != nil {
			return true
		}
		_, dp, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		if err != nil && part.Header.Get("Content-Disposition") != "" || hit(dp["name"]) {
			return true
		}
	}
}
