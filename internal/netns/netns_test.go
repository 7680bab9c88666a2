package netns

import (
	"net/netip"
	"os"
	goruntime "runtime"
	"testing"
	"time"

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
		n, err := Create("0123456789ab", netip.MustParsePrefix("10.250.0.0/24"), leases, ports, false)
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
		c, _ := nftables.New(nftables.WithNetNSFd(int(n.NS)))
		_, filter := chains()
		rs, _ := c.GetRules(table, filter)
		if len(rs) != 7 {
			t.Fatalf("%d egress rules in the sandbox namespace, want 7", len(rs))
		}
		if host, _ := nftables.New(); host != nil {
			if ts, _ := host.ListTables(); len(ts) != 0 {
				t.Fatalf("tables in the host namespace: %v", ts)
			}
		}
		// A second sandbox gets its own subnet.
		m, err := Create("ba9876543210", netip.MustParsePrefix("10.250.0.0/24"), leases, ports, false)
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
		// The veth goes with the namespace, asynchronously.
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, err := netlink.LinkByName(n.HostIf); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("veth left")
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func TestHostSideRulesAreJudgedOnTheVethsHostEndAndGoWithTheNet(t *testing.T) {
	inThrowawayNS(t, func() {
		ports := Ports{Explicit: 3128, TransparentHTTP: 3129, TransparentTLS: 3130, DNS: 53}
		n, err := Create("0123456789ab", netip.MustParsePrefix("10.250.0.0/24"), t.TempDir(), ports, true)
		if err != nil {
			t.Fatal(err)
		}
		host, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		tb := hostTable(n.HostIf)
		nat, filter := hostChains(tb)
		for ch, want := range map[*nftables.Chain]int{nat: 5, filter: 6} {
			if rs, _ := host.GetRules(tb, ch); len(rs) != want {
				t.Errorf("%d rules in the host side's %s, want %d", len(rs), ch.Name, want)
			}
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		if left, _ := hostTables(); len(left) != 0 {
			t.Fatalf("host side's tables left after Close: %v", left)
		}
		// A table whose veth is gone (its owner killed) is reaped; one
		// whose veth is there is not.
		m, err := Create("ba9876543210", netip.MustParsePrefix("10.250.0.0/24"), t.TempDir(), ports, true)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := addHostRules(hostIfName("deadbeef0000"), m.HostIP, netip.MustParsePrefix("10.250.0.0/24"), ports); err != nil {
			t.Fatal(err)
		}
		if err := Reap(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		if left, _ := hostTables(); len(left) != 1 || left[0] != m.HostIf {
			t.Fatalf("after Reap: %v, want only %s", left, m.HostIf)
		}
	})
}
