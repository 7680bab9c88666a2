package broker

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/broker/keys"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// TokenPrefix starts every token: what a sandbox holds in place of a
// credential.
const TokenPrefix = "alk_"

// tokenPattern finds tokens in text; a string that looks like one is
// treated as one (stripped where it does not belong) even when forged.
// Compiled on first use: every airlock process (a sandbox's init too)
// would pay for it at start.
var tokenPattern = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`alk_[A-Za-z0-9_-]{16,1000}\.[A-Za-z0-9_-]{43}`)
})

// Claims are what a token says, signed by the broker.
type Claims struct {
	Sandbox  string   `json:"sbx"`
	Grant    int      `json:"grt"`           // index in the sandbox's grants
	Audience string   `json:"aud"`           // host:port it is good for
	Scope    []string `json:"scp"`           // the grant's request rules
	Expires  int64    `json:"exp,omitempty"` // unix seconds; 0: the sandbox's life (revoked when it ends)
	ID       string   `json:"jti"`
}

// Token refusals.
var (
	ErrMalformed    = errors.New("not a token the broker made")
	ErrForged       = errors.New("signature does not verify")
	ErrRevoked      = errors.New("revoked: its sandbox was destroyed")
	ErrOtherSandbox = errors.New("issued to another sandbox")
	ErrExpired      = errors.New("expired")
	ErrOutOfScope   = errors.New("outside its scope")
)

func mintToken(k *keys.Keys, c Claims) string {
	b, _ := json.Marshal(c)
	payload := base64.RawURLEncoding.EncodeToString(b)
	return TokenPrefix + payload + "." + base64.RawURLEncoding.EncodeToString(k.Sign(payload))
}

func newTokenID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// parseToken checks the signature and decodes the claims.
func parseToken(k *keys.Keys, tok string) (*Claims, error) {
	rest, ok := strings.CutPrefix(tok, TokenPrefix)
	payload, sig, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return nil, ErrMalformed
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return nil, ErrMalformed
	}
	if !hmac.Equal(got, k.Sign(payload)) {
		return nil, ErrForged
	}
	b, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return nil, ErrMalformed
	}
	var c Claims
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, ErrMalformed
	}
	return &c, nil
}

// Allows reports whether the claims cover a request to host:port with
// method and URL u.
func (c *Claims) Allows(host string, port int, method string, u *url.URL) bool {
	if c.Audience != fmt.Sprintf("%s:%d", host, port) {
		return false
	}
	for _, s := range c.Scope {
		r, err := spec.ParseRequestRule(s)
		if err == nil && r.Matches(method, u) {
			return true
		}
	}
	return false
}

// expired reports whether the claims ended by time at now.
func (c *Claims) expired(now time.Time) bool {
	return c.Expires != 0 && !now.Before(time.Unix(c.Expires, 0))
}
