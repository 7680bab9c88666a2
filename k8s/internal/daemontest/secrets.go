package daemontest

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/api"
)

// storedSecret is a tenant's secret as the fake daemon keeps it.
type storedSecret struct {
	value   string
	version int
}

// handleSecrets serves the tenant secret calls of docs/api.md (GET, POST,
// PUT, DELETE /v1/secrets) on mux.
func (d *Daemon) handleSecrets(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/secrets", func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := d.secretCall(w, r, nil)
		if !ok {
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		out := []*api.Secret{}
		for k, s := range d.secrets {
			if name, found := strings.CutPrefix(k, tenant+"/"); found {
				out = append(out, &api.Secret{Name: name, Version: s.version})
			}
		}
		reply(w, 200, out)
	})
	mux.HandleFunc("POST /v1/secrets", func(w http.ResponseWriter, r *http.Request) {
		var req api.AddSecret
		tenant, ok := d.secretCall(w, r, &req)
		if !ok {
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		k := tenant + "/" + req.Name
		if _, taken := d.secrets[k]; taken {
			fail(w, 409, api.CodeAlreadyExists, "secret "+req.Name+" exists")
			return
		}
		d.secrets[k] = &storedSecret{value: req.Value, version: 1}
		reply(w, 201, &api.Secret{Name: req.Name, Version: 1, Created: time.Now(), Updated: time.Now()})
	})
	mux.HandleFunc("PUT /v1/secrets/{name}", func(w http.ResponseWriter, r *http.Request) {
		var req api.RotateSecret
		tenant, ok := d.secretCall(w, r, &req)
		if !ok {
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		s := d.secrets[tenant+"/"+r.PathValue("name")]
		if s == nil {
			fail(w, 404, api.CodeNotFound, "no secret "+r.PathValue("name"))
			return
		}
		s.value = req.Value
		s.version++
		reply(w, 200, &api.Secret{Name: r.PathValue("name"), Version: s.version, Updated: time.Now()})
	})
	mux.HandleFunc("DELETE /v1/secrets/{name}", func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := d.secretCall(w, r, nil)
		if !ok {
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		k := tenant + "/" + r.PathValue("name")
		if d.secrets[k] == nil {
			fail(w, 404, api.CodeNotFound, "no secret "+r.PathValue("name"))
			return
		}
		delete(d.secrets, k)
		w.WriteHeader(204)
	})
}

// secretCall checks a tenant key and decodes the body into req (if any).
func (d *Daemon) secretCall(w http.ResponseWriter, r *http.Request, req any) (string, bool) {
	c, ok := d.who(r)
	if !ok || c.admin {
		fail(w, 401, api.CodeUnauthenticated, "a tenant key is needed")
		return "", false
	}
	if req != nil {
		if err := json.NewDecoder(r.Body).Decode(req); err != nil {
			fail(w, 400, api.CodeInvalidArgument, err.Error())
			return "", false
		}
	}
	d.mu.Lock()
	if d.secrets == nil {
		d.secrets = map[string]*storedSecret{}
	}
	d.mu.Unlock()
	return c.tenant, true
}

// missingGrantSecretLocked names a secret of tenant's that grants name and
// the daemon lacks ("" if none), as a create checks.
func (d *Daemon) missingGrantSecretLocked(tenant string, grants []api.Grant) string {
	for _, g := range grants {
		if d.secrets[tenant+"/"+g.Secret] == nil {
			return g.Secret
		}
	}
	return ""
}

// Secret returns tenant's secret name: its value and version.
func (d *Daemon) Secret(tenant, name string) (value string, version int, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.secrets[tenant+"/"+name]
	if s == nil {
		return "", 0, false
	}
	return s.value, s.version, true
}
