// Package keys holds the broker's key material, derived from one master
// key in a file no sandbox can reach: the AEAD that seals tenants' secrets
// at rest (internal/secret), the MAC that signs the broker's tokens
// (internal/broker) and the MAC that names a found credential in records
// without letting anyone test guesses of it offline. It imports only the
// standard library.
package keys

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Keys are the key material, all derived from one 32-byte master key: the AEAD that seals secrets at rest, the MAC that signs tokens, and
// the MAC that fingerprints findings (a fingerprint names a value without
// letting anyone test guesses of it offline).
type Keys struct {
	aead  cipher.AEAD
	token []byte
	print []byte
}

// New derives the keys from master (32 bytes).
func New(master []byte) (*Keys, error) {
	if len(master) != 32 {
		return nil, errors.New("keys: the master key must be 32 bytes")
	}
	derive := func(info string) []byte {
		k, err := hkdf.Key(sha256.New, master, nil, info, 32)
		if err != nil {
			panic(err) // only for lengths hkdf cannot produce
		}
		return k
	}
	block, err := aes.NewCipher(derive("airlock secrets v1"))
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Keys{aead: aead, token: derive("airlock tokens v1"), print: derive("airlock fingerprints v1")}, nil
}

// Ephemeral are keys for one process (airlock run): nothing is sealed
// for later and no token outlives the run.
func Ephemeral() *Keys {
	master := make([]byte, 32)
	_, _ = rand.Read(master)
	k, _ := New(master)
	return k
}

// LoadFile reads the master key at path (64 hex characters), making
// it (0600, its directory 0700) on first use. The file must be owned by
// this user and readable by nobody else.
func LoadFile(path string) (*Keys, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		master := make([]byte, 32)
		_, _ = rand.Read(master)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("broker key: %w", err)
		}
		_, werr := f.WriteString(hex.EncodeToString(master) + "\n")
		if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("broker key: %w", err)
		}
		return New(master)
	}
	if err != nil {
		return nil, fmt.Errorf("broker key: %w", err)
	}
	if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("broker key %s: readable by others (mode %v); chmod 600 it", path, st.Mode().Perm())
	}
	master, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(master) != 32 {
		return nil, fmt.Errorf("broker key %s: not 64 hex characters", path)
	}
	return New(master)
}

// Seal encrypts plain, bound to context (the tenant and secret name and
// version): a sealed value moved to another name does not open.
func (k *Keys) Seal(context string, plain []byte) []byte {
	nonce := make([]byte, k.aead.NonceSize())
	_, _ = rand.Read(nonce)
	return k.aead.Seal(nonce, nonce, plain, []byte(context))
}

// Open decrypts what Seal made under the same context.
func (k *Keys) Open(context string, sealed []byte) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("keys: sealed value too short")
	}
	plain, err := k.aead.Open(nil, sealed[:n], sealed[n:], []byte(context))
	if err != nil {
		return nil, errors.New("keys: sealed value does not open (wrong key, or moved)")
	}
	return plain, nil
}

// Fingerprint names a value in records: a keyed MAC, 16 hex characters.
func (k *Keys) Fingerprint(value string) string {
	m := hmac.New(sha256.New, k.print)
	m.Write([]byte(value))
	return "hmac:" + hex.EncodeToString(m.Sum(nil)[:8])
}

// Sign is the MAC of a token's payload.
func (k *Keys) Sign(payload string) []byte {
	m := hmac.New(sha256.New, k.token)
	m.Write([]byte(payload))
	return m.Sum(nil)
}
