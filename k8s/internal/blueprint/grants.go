package blueprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/airlock-sandbox/airlock/api"
)

// AnnotationGrants on the pod template holds a JSON list of airlock grants
// (docs/api.md, create's grants) whose secret is "SECRETNAME/KEY": a key
// of a Secret in the object's namespace labelled LabelGrant "true".
const AnnotationGrants = "airlock.dev/grants"

// LabelGrant marks the Secrets a grant may name; the controller reads no
// other Secret for grants.
const LabelGrant = "airlock.dev/grant"

// AnnotationGrantHosts on a Secret lists (comma-separated) the only hosts
// grants of its keys may name; without it, any host.
const AnnotationGrantHosts = "airlock.dev/grant-hosts"

// SecretRef is one key of a Kubernetes Secret that a blueprint's grants
// use, and the daemon secret it is pushed to.
type SecretRef struct {
	Name string // the Secret, in the sandbox's namespace
	Key  string // its data key
	// Daemon is the daemon secret's name: DaemonSecretName(Name, Key).
	Daemon string
	// Hosts are the hosts the blueprint's grants of it name.
	Hosts []string
}

// DaemonSecretName is the name of the daemon secret holding key of Secret
// name: "k8s-" and 32 hex digits of SHA-256(name + "/" + key), always a
// valid daemon secret name (1-64 of a-z 0-9 . _ -) and the same on every
// node and controller.
func DaemonSecretName(name, key string) string {
	sum := sha256.Sum256([]byte(name + "/" + key))
	return "k8s-" + hex.EncodeToString(sum[:16])
}

// grantsPath is where a refusal of the annotation points.
const grantsPath = "spec.podTemplate.metadata.annotations[" + AnnotationGrants + "]"

// parseGrants reads the annotation's value: the grants with their secrets
// named by daemon name, and the Secret keys they use (each once).
func parseGrants(v string) ([]api.Grant, []SecretRef, []Field) {
	bad := func(format string, a ...any) []Field {
		return []Field{{grantsPath, fmt.Sprintf(format, a...)}}
	}
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	var grants []api.Grant
	if err := dec.Decode(&grants); err != nil {
		return nil, nil, bad("not a JSON list of grants: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, bad("not a JSON list of grants: data after the list")
	}
	if len(grants) == 0 {
		return nil, nil, bad("names no grant")
	}
	var refs []SecretRef
	seen := map[string]int{} // daemon name → index in refs
	for i := range grants {
		g := &grants[i]
		name, key, ok := strings.Cut(g.Secret, "/")
		if !ok || strings.Contains(key, "/") {
			return nil, nil, bad("grant %d: secret %q: want SECRETNAME/KEY", i+1, g.Secret)
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, nil, bad("grant %d: secret name %q: %s", i+1, name, strings.Join(errs, "; "))
		}
		if errs := validation.IsConfigMapKey(key); len(errs) > 0 {
			return nil, nil, bad("grant %d: secret key %q: %s", i+1, key, strings.Join(errs, "; "))
		}
		if g.Host == "" {
			return nil, nil, bad("grant %d: host is required", i+1)
		}
		d := DaemonSecretName(name, key)
		if g.Env == "" {
			// the daemon's default would name the hashed daemon secret
			g.Env = defaultGrantEnv(name, key)
		}
		g.Secret = d
		j, ok := seen[d]
		if !ok {
			j = len(refs)
			seen[d] = j
			refs = append(refs, SecretRef{Name: name, Key: key, Daemon: d})
		}
		if !slices.Contains(refs[j].Hosts, g.Host) {
			refs[j].Hosts = append(refs[j].Hosts, g.Host)
		}
	}
	return grants, refs, nil
}

// defaultGrantEnv is AIRLOCK_GRANT_ and the Secret's name and key in upper
// case, other characters as _ (as the daemon names a grant's variable
// after its secret).
func defaultGrantEnv(name, key string) string {
	var b bytes.Buffer
	b.WriteString("AIRLOCK_GRANT_")
	for _, c := range strings.ToUpper(name + "_" + key) {
		if c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

func copyGrants(gs []api.Grant) []api.Grant {
	if gs == nil {
		return nil
	}
	out := make([]api.Grant, len(gs))
	for i, g := range gs {
		g.Allow = append([]string(nil), g.Allow...)
		out[i] = g
	}
	return out
}
