package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// blocked are the destinations the proxy never dials, whatever the policy
// or DNS says: only the operator's configuration can open one (AllowNets).
var blocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),         // "this network"
	netip.MustParsePrefix("10.0.0.0/8"),        // private
	netip.MustParsePrefix("100.64.0.0/10"),     // CGNAT
	netip.MustParsePrefix("127.0.0.0/8"),       // loopback
	netip.MustParsePrefix("169.254.0.0/16"),    // link-local, cloud metadata
	netip.MustParsePrefix("172.16.0.0/12"),     // private
	netip.MustParsePrefix("192.0.0.0/24"),      // IETF protocol assignments
	netip.MustParsePrefix("192.168.0.0/16"),    // private
	netip.MustParsePrefix("198.18.0.0/15"),     // benchmarking
	netip.MustParsePrefix("224.0.0.0/4"),       // multicast
	netip.MustParsePrefix("240.0.0.0/4"),       // reserved, broadcast
	netip.MustParsePrefix("::/128"),            // unspecified
	netip.MustParsePrefix("::1/128"),           // loopback
	netip.MustParsePrefix("::ffff:0:0/96"),     // IPv4-mapped (checked unmapped too)
	netip.MustParsePrefix("64:ff9b::/96"),      // NAT64
	netip.MustParsePrefix("64:ff9b:1::/48"),    // local NAT64
	netip.MustParsePrefix("100::/64"),          // discard
	netip.MustParsePrefix("2001:db8::/32"),     // documentation
	netip.MustParsePrefix("fc00::/7"),          // unique local
	netip.MustParsePrefix("fe80::/10"),         // link-local
	netip.MustParsePrefix("ff00::/8"),          // multicast
	netip.MustParsePrefix("fd00:ec2::254/128"), // AWS metadata over IPv6 (inside fc00::/7 too)
}

// Guard decides which addresses the proxy may connect to.
type Guard struct {
	// AllowNets are exceptions granted by the operator's configuration
	// (never by a run's or a tenant's policy).
	AllowNets []netip.Prefix
}

// ErrBlockedAddress classes dials the guard refused.
var ErrBlockedAddress = errors.New("blocked destination")

// Check returns an error naming why addr may not be dialled.
func (g *Guard) Check(addr netip.Addr) error {
	a := addr.Unmap()
	for _, p := range g.AllowNets {
		if p.Contains(a) {
			return nil
		}
	}
	for _, p := range blocked {
		if p.Contains(a) || p.Contains(addr) {
			return fmt.Errorf("%w: %s is in %s, which is never dialled", ErrBlockedAddress, a, p)
		}
	}
	return nil
}

// Control is a net.Dialer Control function enforcing the guard on the
// address actually being connected to, after DNS (the rebinding defence).
func (g *Guard) Control(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("dial %s: not an IP address", address)
	}
	return g.Check(ip)
}
