package netns

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// airlock's nftables tables are one per sandbox, "inet <scope>-<id>"
// (scope "airlock" for the default state directory), created in one batch
// and deleted in one. No other table is touched, and no shared state is
// left behind.
func tableFor(scope, id string) *nftables.Table {
	return &nftables.Table{Name: scope + "-" + id, Family: nftables.TableFamilyINet}
}

// earlyPriority runs before destination NAT (-100), so that every packet
// from the sandbox is judged (and a denied one counted) before routing,
// whatever the host's forwarding settings.
var earlyPriority = nftables.ChainPriorityRef(-200)

func earlyChain(table *nftables.Table) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: "early", Table: table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: earlyPriority, Policy: &accept}
}

func baseChains(table *nftables.Table) (pre, input, forward *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	pre = &nftables.Chain{Name: "prerouting", Table: table, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest}
	input = &nftables.Chain{Name: "input", Table: table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	forward = &nftables.Chain{Name: "forward", Table: table, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	return
}

type firewall struct {
	table *nftables.Table
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

// match builders
func fromIf(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func toIPv4(a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]},
	}
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

// addRules adds one sandbox's rules in one batch:
//
//	early:      from the veth: to hostIP, the proxy ports and DNS accepted;
//	            TCP 80 and 443 to anywhere accepted (redirected next);
//	            everything else counted and dropped
//	prerouting: from the veth, TCP 80 -> hostIP:transparent-http,
//	            TCP 443 -> hostIP:transparent-tls
//	input:      from the veth to hostIP: the proxy ports and DNS accepted,
//	            everything else counted and dropped
//	forward:    from the veth: counted and dropped (no routing anywhere)
func addRules(scope, id, hostIf string, hostIP netip.Addr, ports Ports) (*firewall, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	fw := &firewall{table: tableFor(scope, id)}
	pre, input, forward := baseChains(fw.table)
	early := earlyChain(fw.table)
	c.AddTable(fw.table)
	c.AddChain(early)
	c.AddChain(pre)
	c.AddChain(input)
	c.AddChain(forward)
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
	add := func(ch *nftables.Chain, e []expr.Any) {
		c.AddRule(&nftables.Rule{Table: fw.table, Chain: ch, Exprs: e})
	}
	v4 := []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}}
	for _, p := range []int{ports.Explicit, ports.TransparentHTTP, ports.TransparentTLS, ports.DNS} {
		add(early, cat(fromIf(hostIf), toIPv4(hostIP), proto(unix.IPPROTO_TCP, p), accept))
	}
	add(early, cat(fromIf(hostIf), toIPv4(hostIP), proto(unix.IPPROTO_UDP, ports.DNS), accept))
	add(early, cat(fromIf(hostIf), v4, proto(unix.IPPROTO_TCP, 80), accept))
	add(early, cat(fromIf(hostIf), v4, proto(unix.IPPROTO_TCP, 443), accept))
	add(early, cat(fromIf(hostIf), drop))
	add(pre, cat(fromIf(hostIf), v4, proto(unix.IPPROTO_TCP, 80), dnat(ports.TransparentHTTP)))
	add(pre, cat(fromIf(hostIf), v4, proto(unix.IPPROTO_TCP, 443), dnat(ports.TransparentTLS)))
	for _, p := range []int{ports.Explicit, ports.TransparentHTTP, ports.TransparentTLS, ports.DNS} {
		add(input, cat(fromIf(hostIf), toIPv4(hostIP), proto(unix.IPPROTO_TCP, p), accept))
	}
	add(input, cat(fromIf(hostIf), toIPv4(hostIP), proto(unix.IPPROTO_UDP, ports.DNS), accept))
	add(input, cat(fromIf(hostIf), drop))
	add(forward, cat(fromIf(hostIf), drop))
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables: add rules for %s: %w", id, err)
	}
	return fw, nil
}

// rules lists this sandbox's rules.
func (fw *firewall) rules(c *nftables.Conn) ([]*nftables.Rule, error) {
	pre, input, forward := baseChains(fw.table)
	var out []*nftables.Rule
	for _, ch := range []*nftables.Chain{earlyChain(fw.table), pre, input, forward} {
		rs, err := c.GetRules(fw.table, ch)
		if err != nil {
			return nil, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

func (fw *firewall) remove() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.DelTable(fw.table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: delete table %s: %w", fw.table.Name, err)
	}
	return nil
}

func (fw *firewall) denied() uint64 {
	c, err := nftables.New()
	if err != nil {
		return 0
	}
	rs, _ := fw.rules(c)
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

// RemoveDead deletes the tables of this scope's sandboxes for which live
// reports false (gc after a killed run).
func RemoveDead(scope string, live func(id string) bool) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil
	}
	dead := 0
	for _, t := range tables {
		// A sandbox id is 12 hex digits: other scopes never match.
		if id, ok := strings.CutPrefix(t.Name, scope+"-"); ok && len(id) == 12 && !strings.Contains(id, "-") && !live(id) {
			c.DelTable(t)
			dead++
		}
	}
	if dead == 0 {
		return nil
	}
	return c.Flush()
}
