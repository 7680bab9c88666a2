package netns

import (
	"encoding/binary"
	"fmt"
	"net/netip"

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
	nsfd int
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
	ip := hostIP.As4()
	dnat := func(port int) []expr.Any {
		return []expr.Any{
			&expr.Immediate{Register: 1, Data: ip[:]},
			&expr.Immediate{Register: 2, Data: port16(port)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		}
	}
	accept := []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	add(nat, cat(toIf("lo", false), ipv4(), proto(unix.IPPROTO_TCP, 80), dnat(ports.TransparentHTTP)))
	add(nat, cat(toIf("lo", false), ipv4(), proto(unix.IPPROTO_TCP, 443), dnat(ports.TransparentTLS)))
	add(filter, cat(toIf("lo", true), accept))
	for _, p := range []int{ports.Explicit, ports.TransparentHTTP, ports.TransparentTLS, ports.DNS} {
		add(filter, cat(toIPv4(hostIP), proto(unix.IPPROTO_TCP, p), accept))
	}
	add(filter, cat(toIPv4(hostIP), proto(unix.IPPROTO_UDP, ports.DNS), accept))
	add(filter, drop)
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables: add rules: %w", err)
	}
	return &firewall{nsfd: nsfd}, nil
}

// denied sums the drop counters.
func (fw *firewall) denied() uint64 {
	c, err := nftables.New(nftables.WithNetNSFd(fw.nsfd))
	if err != nil {
		return 0
	}
	_, filter := chains()
	rs, _ := c.GetRules(table, filter)
	var n uint64
	for _, r := range rs {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				n += ctr.Packets
			}
		}
	}
	return n
}
