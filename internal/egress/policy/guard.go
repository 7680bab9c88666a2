package policy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// blocked are the destinations the proxy never dials, whatever the policy
// or DNS says: only the operator's configuration can open one (AllowNets).
// IANA's special-purpose registries, less the ranges that are globally
// reachable by design (anycast services).
var blocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),         // "this network"
	netip.MustParsePrefix("10.0.0.0/8"),        // private
	netip.MustParsePrefix("100.64.0.0/10"),     // CGNAT
	netip.MustParsePrefix("127.0.0.0/8"),       // loopback
	netip.MustParsePrefix("169.254.0.0/16"),    // link-local, cloud metadata
	netip.MustParsePrefix("168.63.129.16/32"),  // Azure's WireServer (a platform address, not the internet)
	netip.MustParsePrefix("172.16.0.0/12"),     // private
	netip.MustParsePrefix("192.0.0.0/24"),      // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),      // documentation (TEST-NET-1)
	netip.MustParsePrefix("192.88.99.0/24"),    // 6to4 relay anycast (deprecated; reaches embedded IPv4)
	netip.MustParsePrefix("192.168.0.0/16"),    // private
	netip.MustParsePrefix("198.18.0.0/15"),     // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"),   // documentation (TEST-NET-2)
	netip.MustParsePrefix("203.0.113.0/24"),    // documentation (TEST-NET-3)
	netip.MustParsePrefix("224.0.0.0/4"),       // multicast
	netip.MustParsePrefix("240.0.0.0/4"),       // reserved, broadcast
	netip.MustParsePrefix("::/128"),            // unspecified
	netip.MustParsePrefix("::1/128"),           // loopback
	netip.MustParsePrefix("::/96"),             // IPv4-compatible (deprecated; reaches embedded IPv4)
	netip.MustParsePrefix("::/8"),              // reserved by the IETF: IPv4-translated ::ffff:0:a.b.c.d (SIIT) and the rest
	netip.MustParsePrefix("::ffff:0:0/96"),     // IPv4-mapped (checked unmapped too)
	netip.MustParsePrefix("64:ff9b::/96"),      // NAT64
	netip.MustParsePrefix("64:ff9b:1::/48"),    // local NAT64
	netip.MustParsePrefix("100::/64"),          // discard
	netip.MustParsePrefix("2001::/32"),         // Teredo (reaches embedded IPv4)
	netip.MustParsePrefix("2001:2::/48"),       // benchmarking
	netip.MustParsePrefix("2001:db8::/32"),     // documentation
	netip.MustParsePrefix("2002::/16"),         // 6to4 (reaches embedded IPv4)
	netip.MustParsePrefix("3fff::/20"),         // documentation
	netip.MustParsePrefix("fc00::/7"),          // unique local
	netip.MustParsePrefix("fe80::/10"),         // link-local
	netip.MustParsePrefix("fec0::/10"),         // site-local (deprecated)
	netip.MustParsePrefix("ff00::/8"),          // multicast
	netip.MustParsePrefix("fd00:ec2::254/128"), // AWS metadata over IPv6 (inside fc00::/7 too)
}

// Guard decides which addresses the proxy may connect to. Before the table
// and the operator's exceptions, two refusals nothing opens: the host's own
// addresses (a service listening on the host answers on every one of them,
// not only on loopback) and the sandboxes' subnet pool (every other
// sandbox's veth).
type Guard struct {
	// AllowNets are exceptions granted by the operator's configuration
	// (never by a run's or a tenant's policy). They open ranges of the
	// table, never the host's own addresses or Sandboxes.
	AllowNets []netip.Prefix
	// Sandboxes is the pool the sandboxes' veths are leased from; the
	// zero prefix when there is none.
	Sandboxes netip.Prefix
	// Local lists the destinations this host answers itself, at the moment
	// of a decision. Nil: LocalPrefixes, read from the kernel each time,
	// so an address added a moment ago counts.
	Local func() ([]netip.Prefix, error)
}

// ErrBlockedAddress classes dials the guard refused.
var ErrBlockedAddress = errors.New("blocked destination")

// Check returns an error naming why addr may not be dialled.
func (g *Guard) Check(addr netip.Addr) error { return g.Checker()(addr) }

// Checker reads the host's own addresses once and returns Check for the
// addresses decided at this moment (the records of one DNS answer), so a
// batch costs one read of the kernel's tables, not one per address.
func (g *Guard) Checker() func(netip.Addr) error {
	local := g.Local
	if local == nil {
		local = LocalPrefixes
	}
	own, err := local()
	return func(addr netip.Addr) error { return g.check(addr, own, err) }
}

// check decides addr given the host's own prefixes (or the error that
// kept them unknown: then nothing is dialled).
func (g *Guard) check(addr netip.Addr, own []netip.Prefix, err error) error {
	a := addr.Unmap()
	if g.Sandboxes.IsValid() && g.Sandboxes.Contains(a) {
		return fmt.Errorf("%w: %s is in the sandboxes' subnet pool %s, which is never dialled", ErrBlockedAddress, a, g.Sandboxes)
	}
	if err != nil {
		return fmt.Errorf("%w: %s: the host's own addresses are unknown (%v), so nothing is dialled", ErrBlockedAddress, a, err)
	}
	for _, p := range own {
		if p.Contains(a) {
			return fmt.Errorf("%w: %s is an address of this host (%s), which is never dialled", ErrBlockedAddress, a, p)
		}
	}
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

// LocalPrefixes lists what this host (its network namespace) answers
// itself, from two rtnetlink dumps: every address of every interface, and
// every route of type local in any table (loopback's 127.0.0.0/8, and
// "AnyIP" routes that make a whole prefix local).
func LocalPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	addrs, err := rib(syscall.RTM_GETADDR)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, m := range addrs {
		if m.Header.Type != syscall.RTM_NEWADDR || len(m.Data) < syscall.SizeofIfAddrmsg {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			return nil, fmt.Errorf("list addresses: %w", err)
		}
		for _, at := range attrs {
			if at.Attr.Type == syscall.IFA_ADDRESS || at.Attr.Type == syscall.IFA_LOCAL {
				if a, ok := netip.AddrFromSlice(at.Value); ok {
					out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
				}
			}
		}
	}
	routes, err := rib(syscall.RTM_GETROUTE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	for _, m := range routes {
		if m.Header.Type != syscall.RTM_NEWROUTE || len(m.Data) < syscall.SizeofRtMsg {
			continue
		}
		// struct rtmsg: family, dst_len, src_len, tos, table, protocol,
		// scope, type, flags.
		dstLen, typ := int(m.Data[1]), m.Data[7]
		if typ != syscall.RTN_LOCAL {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, at := range attrs {
			if at.Attr.Type != syscall.RTA_DST {
				continue
			}
			if a, ok := netip.AddrFromSlice(at.Value); ok {
				if p, err := a.Prefix(dstLen); err == nil {
					out = append(out, p)
				}
			}
		}
	}
	return out, nil
}

// rib dumps one rtnetlink table (addresses or routes) of both families.
func rib(typ int) ([]syscall.NetlinkMessage, error) {
	b, err := syscall.NetlinkRIB(typ, syscall.AF_UNSPEC)
	if err != nil {
		return nil, err
	}
	return syscall.ParseNetlinkMessage(b)
}
