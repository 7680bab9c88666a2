package netns

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The rules live in the sandbox's own network namespace (created and owned
// by the host, so nothing inside can change them), in one table added in one
// atomic batch. Every packet the sandbox sends is judged there, before it
// reaches the veth; the table dies with the namespace, so nothing is left on
// the host and nothing needs deleting.
//
//	nat output (priority dstnat): TCP 80 -> hostIP:transparent-http,
//	                              TCP 443 -> hostIP:transparent-tls
//	filter output:                loopback accepted; to hostIP, the proxy
//	                              ports and DNS accepted; everything else
//	                              (IPv6 included) counted and dropped
const tableName = "airlock"

var table = &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}

func chains() (nat, filter *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	nat = &nftables.Chain{Name: "redirect", Table: table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest}
	filter = &nftables.Chain{Name: "egress", Table: table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	return
}

type firewall struct {
	nsfd   int
	hostIf string // the host end of the veth, when the host side has rules too
}

func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func port16(p int) []byte {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, uint16(p))
	return b
}

func toIf(name string, eq bool) []expr.Any {
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(name)},
	}
}

func fromIf(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

func toIPv4(a netip.Addr) []expr.Any {
	b := a.As4()
	return append(ipv4(),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]},
	)
}

func proto(p byte, port int) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port16(port)},
	}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var (
	accept = []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	drop   = []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
)

func dnat(hostIP netip.Addr, port int) []expr.Any {
	ip := hostIP.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: ip[:]},
		&expr.Immediate{Register: 2, Data: port16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// toProxy are the packets the sandbox may send: to the host end of its
// veth, on the proxy's ports and DNS.
func toProxy(hostIP netip.Addr, ports Ports) [][]expr.Any {
	var out [][]expr.Any
	for _, p := range []int{ports.Explicit, ports.TransparentHTTP, ports.TransparentTLS, ports.DNS} {
		out = append(out, cat(toIPv4(hostIP), proto(unix.IPPROTO_TCP, p)))
	}
	return append(out, cat(toIPv4(hostIP), proto(unix.IPPROTO_UDP, ports.DNS)))
}

// addRules installs the sandbox's rules in its namespace nsfd.
func addRules(nsfd int, hostIP netip.Addr, ports Ports) (*firewall, error) {
	c, err := nftables.New(nftables.WithNetNSFd(nsfd))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	nat, filter := chains()
	c.AddTable(table)
	c.AddChain(nat)
	c.AddChain(filter)
	add := func(ch *nftables.Chain, e []expr.Any) {
		c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: e})
	}
	add(nat, cat(toIf("lo", false), ipv4(), proto(unix.IPPROTO_TCP, 80), dnat(hostIP, ports.TransparentHTTP)))
	add(nat, cat(toIf("lo", false), ipv4(), proto(unix.IPPROTO_TCP, 443), dnat(hostIP, ports.TransparentTLS)))
	add(filter, cat(toIf("lo", true), accept))
	for _, m := range toProxy(hostIP, ports) {
		add(filter, cat(m, accept))
	}
	add(filter, drop)
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables: add rules: %w", err)
	}
	return &firewall{nsfd: nsfd}, nil
}

// The host side's rules, for a wall whose sandbox puts its own frames on
// the veth: gVisor's netstack, inside the Sentry, writes them through a
// packet socket bound to eth0, which the namespace's IP hooks (the output
// chains above) never see. The same judgement is then made where those
// frames arrive, on the veth's host end, in the host's namespace: one
// table per sandbox, named after that end, added in one batch after the
// veth and deleted when the sandbox's network is closed (Reap deletes
// those whose veth is gone, their owner killed).
//
//	nat prerouting (priority dstnat):     from the veth, TCP 80 -> hostIP:transparent-http,
//	                                      TCP 443 -> hostIP:transparent-tls,
//	                                      TCP explicit, TCP/UDP 53 to any
//	                                      address of the pool -> hostIP's
//	                                      explicit proxy and DNS
//	filter prerouting (priority filter):  from the veth, to hostIP, the proxy
//	                                      ports and DNS accepted; anything else
//	                                      from it (IPv6 included) counted and
//	                                      dropped, before the host routes it
//
// The third rule is for a sandbox restored from a checkpoint: its
// processes kept the proxy's and the resolver's address they were started
// with, which was the source sandbox's host end, another address of the
// pool. Whichever host end of the pool they name, the sandbox reaches its
// own proxy and resolver on those ports, and never another sandbox's (the
// source's host end is a local address of this host too).
const hostTablePrefix = "airlock-"

func hostTable(hostIf string) *nftables.Table {
	return &nftables.Table{Name: hostTablePrefix + hostIf, Family: nftables.TableFamilyINet}
}

func hostChains(t *nftables.Table) (nat, filter *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	nat = &nftables.Chain{Name: "redirect", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest}
	filter = &nftables.Chain{Name: "ingress", Table: t, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	return
}

// inPrefix matches IPv4 packets to an address of p.
func inPrefix(p netip.Prefix) []expr.Any {
	mask := net.CIDRMask(p.Bits(), 32)
	base := p.Masked().Addr().As4()
	return append(ipv4(),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: base[:]},
	)
}

// addHostRules installs the host side's rules of the sandbox whose veth's
// host end is hostIf, hostIP leased from pool.
func addHostRules(hostIf string, hostIP netip.Addr, pool netip.Prefix, ports Ports) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := hostTable(hostIf)
	nat, filter := hostChains(t)
	c.AddTable(t)
	c.AddChain(nat)
	c.AddChain(filter)
	add := func(ch *nftables.Chain, e []expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e})
	}
	from := fromIf(hostIf)
	add(nat, cat(from, ipv4(), proto(unix.IPPROTO_TCP, 80), dnat(hostIP, ports.TransparentHTTP)))
	add(nat, cat(from, ipv4(), proto(unix.IPPROTO_TCP, 443), dnat(hostIP, ports.TransparentTLS)))
	add(nat, cat(from, inPrefix(pool), proto(unix.IPPROTO_TCP, ports.Explicit), dnat(hostIP, ports.Explicit)))
	add(nat, cat(from, inPrefix(pool), proto(unix.IPPROTO_TCP, 53), dnat(hostIP, ports.DNS)))
	add(nat, cat(from, inPrefix(pool), proto(unix.IPPROTO_UDP, 53), dnat(hostIP, ports.DNS)))
	for _, m := range toProxy(hostIP, ports) {
		add(filter, cat(from, m, accept))
	}
	add(filter, cat(from, drop))
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: add the host side's rules: %w", err)
	}
	return nil
}

// hostTables lists the host side's tables by the veth they are for.
func hostTables() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range ts {
		if hostIf, ok := strings.CutPrefix(t.Name, hostTablePrefix); ok && isHostIf(hostIf) {
			out = append(out, hostIf)
		}
	}
	return out, nil
}

// delHostRules deletes the host side's table for hostIf; one already
// gone is no error.
func delHostRules(hostIf string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	c.DelTable(hostTable(hostIf))
	if err := c.Flush(); err != nil {
		if left, lerr := hostTables(); lerr == nil && !slices.Contains(left, hostIf) {
			return nil
		}
		return fmt.Errorf("nftables: delete the host side's rules of %s: %w", hostIf, err)
	}
	return nil
}

// denied sums the drop counters, the host side's included.
func (fw *firewall) denied() uint64 {
	var n uint64
	count := func(c *nftables.Conn, t *nftables.Table, chs ...*nftables.Chain) {
		for _, ch := range chs {
			rs, _ := c.GetRules(t, ch)
			for _, r := range rs {
				for _, e := range r.Exprs {
					if ctr, ok := e.(*expr.Counter); ok {
						n += ctr.Packets
					}
				}
			}
		}
	}
	if c, err := nftables.New(nftables.WithNetNSFd(fw.nsfd)); err == nil {
		_, filter := chains()
		count(c, table, filter)
	}
	if fw.hostIf != "" {
		if c, err := nftables.New(); err == nil {
			t := hostTable(fw.hostIf)
			_, filter := hostChains(t)
			count(c, t, filter)
		}
	}
	return n
}
