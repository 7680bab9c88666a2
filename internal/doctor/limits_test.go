package doctor

import (
	"net/netip"
	"testing"
)

// Each limit's room is what is left of it over what one idle sandbox
// takes, never below zero; the limit every sandbox takes from with the
// least room binds first (the subnet pool, which only proxy mode takes
// from, does not, however small); what idle sandboxes take none of has no
// count.
func TestLimitsSayHowManySandboxesEachAllows(t *testing.T) {
	r := Readings{
		PidMax: 32768, ThreadsMax: 192000, Tasks: 768, // (32768-768)/7 = 4571
		UIDSlots: 16384, UIDsLeased: 384, // 16000
		Pool: netip.MustParsePrefix("10.0.0.0/28"), Subnets: 4, SubnetsLeased: 1, // 3: proxy mode only
		InotifyInstances: 128, InotifyWatches: 8192,
		NoFileSoft: 1024, NoFileHard: 20000, // 20000/7 = 2857
		MemAvailable: 10 * MemoryPerSandbox,                                     // 10
		Namespaces:   map[string][2]int64{"user": {100, 98}, "mnt": {1000, 10}}, // 2
	}
	want := map[string]int64{"pids": 4571, "uid ranges": 16000, "subnets": 3, "descriptors": 2857, "memory": 10, "namespaces": 2}
	check := func(r Readings, first string) {
		t.Helper()
		got := map[string]bool{}
		for _, l := range r.Limits() {
			got[l.Name] = true
			w, counted := want[l.Name]
			switch {
			case !counted && l.Sandboxes != nil:
				t.Errorf("%s: %d sandboxes, want no count", l.Name, *l.Sandboxes)
			case counted && (l.Sandboxes == nil || *l.Sandboxes != w):
				t.Errorf("%s: %v sandboxes, want %d", l.Name, l.Sandboxes, w)
			}
			if l.First != (l.Name == first) {
				t.Errorf("%s binds first: %v, want %v", l.Name, l.First, l.Name == first)
			}
			if l.Detail == "" || l.PerSandbox == "" {
				t.Errorf("%s: no detail or per-sandbox cost: %+v", l.Name, l)
			}
		}
		for _, name := range []string{"pids", "uid ranges", "subnets", "inotify", "descriptors", "memory", "namespaces"} {
			if !got[name] {
				t.Errorf("no %s limit", name)
			}
		}
	}
	check(r, "namespaces")

	r.Namespaces = map[string][2]int64{"user": {100, 0}}
	want["namespaces"] = 100
	check(r, "memory")

	r.Tasks = 40000 // past pid_max: no room, not a negative count
	want["pids"] = 0
	check(r, "pids")
}
