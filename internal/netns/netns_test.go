package netns

import (
	"net/netip"
	"os"
	goruntime "runtime"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// inThrowawayNS runs f on a locked thread inside a new network namespace,
// so nothing here touches the host's links or nftables.
func inThrowawayNS(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err)
		}
	}()
	f()
}

func TestCreateAndClose(t *testing.T) {
	inThrowawayNS(t, func() {
		ports := Ports{Explicit: 3128, TransparentHTTP: 3129, TransparentTLS: 3130, DNS: 53}
		leases := t.TempDir()
		n, err := Create("airlock-unittest", "0123456789ab", netip.MustParsePrefix("10.250.0.0/24"), leases, ports)
		if err != nil {
			t.Fatal(err)
		}
		if n.HostIP.Next() != n.SandboxIP || !netip.MustParsePrefix("10.250.0.0/24").Contains(n.HostIP) {
			t.Fatalf("addresses %s %s", n.HostIP, n.SandboxIP)
		}
		if _, err := netlink.LinkByName(n.HostIf); err != nil {
			t.Fatalf("host veth: %v", err)
		}
		in, _ := netlink.NewHandleAt(n.NS)
		eth, err := in.LinkByName("eth0")
		if err != nil || eth.Attrs().OperState == netlink.OperDown {
			t.Fatalf("eth0: %v", err)
		}
		routes, _ := in.RouteList(eth, netlink.FAMILY_V4)
		var gw bool
		for _, r := range routes {
			gw = gw || r.Gw != nil && r.Gw.String() == n.HostIP.String()
		}
		if !gw {
			t.Fatalf("no default route via %s: %v", n.HostIP, routes)
		}
		in.Close()
		c, _ := nftables.New()
		tbl := tableFor("airlock-unittest", n.ID)
		rs, _ := c.GetRules(tbl, &nftables.Chain{Name: "input", Table: tbl})
		if len(rs) != 6 {
			t.Fatalf("%d input rules, want 6", len(rs))
		}
		// A second sandbox gets its own subnet.
		m, err := Create("airlock-unittest", "ba9876543210", netip.MustParsePrefix("10.250.0.0/24"), leases, ports)
		if err != nil {
			t.Fatal(err)
		}
		if m.HostIP == n.HostIP {
			t.Error("two sandboxes share a subnet")
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := netlink.LinkByName(n.HostIf); err == nil {
			t.Fatal("veth left")
		}
		tables, _ := c.ListTables()
		for _, tb := range tables {
			if tb.Name == tbl.Name {
				t.Fatalf("table %s left", tbl.Name)
			}
		}
	})
}
