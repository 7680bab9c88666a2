package e2bapi

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Tokens derives each sandbox's envd access token from one daemon key:
// stateless, so a token survives daemon restarts and sandbox adoption, and
// dies with its sandbox's id. A token is never logged or recorded.
type Tokens struct{ key []byte }

// keyBytes is the size of the daemon's token key.
const keyBytes = 32

// LoadTokens reads the token key at path, making it (root only, 0600) on
// first use.
func LoadTokens(path string) (*Tokens, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		b = make([]byte, keyBytes)
		_, _ = rand.Read(b)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		tmp := path + ".new"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, err
		}
		return &Tokens{key: b}, nil
	}
	if err != nil {
		return nil, err
	}
	if len(b) != keyBytes {
		return nil, fmt.Errorf("e2b token key %s: %d bytes, want %d", path, len(b), keyBytes)
	}
	return &Tokens{key: b}, nil
}

// NewTokens derives tokens from key (tests).
func NewTokens(key []byte) *Tokens { return &Tokens{key: key} }

// Envd is sandbox id's envd access token (X-Access-Token). The prefix lets
// secret scanners spot a leaked one, as for airlock's API keys.
func (t *Tokens) Envd(id string) string {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte("envd\x00" + id))
	return "airlock_envd_" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckEnvd reports, in constant time, whether token is sandbox id's.
func (t *Tokens) CheckEnvd(id, token string) bool {
	return subtle.ConstantTimeCompare([]byte(t.Envd(id)), []byte(token)) == 1
}

// CheckSignature verifies a signed /files URL of sandbox id, as envd does:
// signature = "v1_" + base64(sha256("path:operation:username:token[:expiration]"))
// (standard alphabet, no padding), operation "read" or "write", and an
// expiration (unix seconds), when given, not yet past.
func (t *Tokens) CheckSignature(id, path, operation, username, signature, expiration string, now time.Time) bool {
	s := path + ":" + operation + ":" + username + ":" + t.Envd(id)
	if expiration != "" {
		exp, err := strconv.ParseInt(expiration, 10, 64)
		if err != nil || now.Unix() > exp {
			return false
		}
		s += ":" + expiration
	}
	sum := sha256.Sum256([]byte(s))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	return subtle.ConstantTimeCompare([]byte(want), []byte(signature)) == 1
}
