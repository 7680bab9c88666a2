package remote

import (
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
)

// What inspect prints of a sandbox holds values its tenant chose
// (metadata, the trigger, grants' names): JSON escapes every control
// character, so a hostile value cannot drive the terminal; and stats'
// table shows only what the daemon measured.
func TestInspectAndStatsShowNoControlCharacters(t *testing.T) {
	hostile := "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\r\u202e"
	sb := &api.Sandbox{ID: "8035500fd41a", State: "running", Image: hostile, Metadata: map[string]string{hostile: hostile},
		Trigger: api.Trigger{TaskID: hostile}, Usage: &api.Usage{CPUSeconds: 1.5, MemoryBytes: 3 << 20}}
	var b strings.Builder
	if err := cmdutil.PrintJSON(&b, []*api.Sandbox{sb}); err != nil {
		t.Fatal(err)
	}
	var s strings.Builder
	if err := writeStats(&s, []*api.Sandbox{sb}); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"inspect": b.String(), "stats": s.String()} {
		if strings.ContainsAny(out, "\x1b\x07\r") {
			t.Errorf("%s wrote a control character: %q", name, out)
		}
	}
	if !strings.Contains(s.String(), "3.0MiB") || !strings.Contains(s.String(), "1.50s") {
		t.Errorf("stats: %s", s.String())
	}
}
