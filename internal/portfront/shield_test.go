package portfront

import (
	"net/http"
	"testing"
)

// On the API's door every sandbox's ports share the daemon's origin: an
// answer of one sandbox's server may not widen a service worker's scope
// past its own port's path (a worker at the origin's root would see
// every request the browser makes to the daemon, another tenant's port
// token URLs included). A front that gives each port an origin of its
// own keeps the header.
func TestSandboxCannotWidenAServiceWorkerOnTheAPIOrigin(t *testing.T) {
	for door, kept := range map[string]bool{"api": false, "e2b": true} {
		res := &http.Response{Header: http.Header{"Service-Worker-Allowed": {"/"}}}
		if err := shield(door)(res); err != nil {
			t.Fatal(err)
		}
		if got := res.Header.Get("Service-Worker-Allowed") != ""; got != kept {
			t.Errorf("door %s: Service-Worker-Allowed kept %v, want %v", door, got, kept)
		}
	}
}
