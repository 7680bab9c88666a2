package egress

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// dnsServer is the sandbox's resolver: it answers A queries for names the
// policy allows (from the upstream resolver), gives empty answers to AAAA
// (the sandbox has no IPv6), refuses every other type (no TXT or NULL
// channel), and answers NXDOMAIN for everything else without asking
// upstream. UDP and TCP.
type dnsServer struct {
	p       *Proxy
	servers []*dns.Server
	client  *dns.Client
}

func startDNS(p *Proxy) (*dnsServer, error) {
	d := &dnsServer{p: p, client: &dns.Client{Timeout: 5 * time.Second}}
	addr := netip.AddrPortFrom(p.cfg.Listen, PortDNS).String()
	lc := p.listenConfig()
	pc, err := lc.ListenPacket(context.Background(), "udp", addr)
	if err != nil {
		return nil, fmt.Errorf("dns forwarder: %w", err)
	}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("dns forwarder: %w", err)
	}
	d.servers = []*dns.Server{{PacketConn: pc, Handler: d}, {Listener: ln, Handler: d}}
	for _, s := range d.servers {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go func(s *dns.Server) { _ = s.ActivateAndServe() }(s)
		<-started
	}
	return d, nil
}

func (d *dnsServer) close() {
	for _, s := range d.servers {
		_ = s.Shutdown()
	}
}

// ServeDNS answers one query.
func (d *dnsServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if !d.p.fromPeer(w.RemoteAddr()) {
		// Not the sandbox: no answer, and nothing recorded as its own.
		_ = w.Close()
		return
	}
	start := time.Now()
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	defer func() { _ = w.WriteMsg(m) }()
	if len(r.Question) != 1 || r.Opcode != dns.OpcodeQuery {
		m.Rcode = dns.RcodeFormatError
		return
	}
	q := r.Question[0]
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	ev := Event{Kind: "dns", Host: name, QType: dns.TypeToString[q.Qtype]}
	defer func() {
		ev.DurationMS = ms(time.Since(start))
		d.p.record(ev)
	}()
	dec := d.p.cfg.Policy.AllowsName(name)
	ev.Rule = dec.Rule
	if !dec.Allowed {
		m.Rcode = dns.RcodeNameError
		ev.Decision, ev.Reason = "denied", name+" "+dec.Reason
		return
	}
	switch q.Qtype {
	case dns.TypeA:
	case dns.TypeAAAA:
		ev.Decision = "allowed" // empty answer: no IPv6 in the sandbox
		return
	default:
		m.Rcode = dns.RcodeRefused
		ev.Decision, ev.Reason = "denied", "only A and AAAA queries are answered"
		return
	}
	up := new(dns.Msg)
	up.SetQuestion(dns.Fqdn(name), dns.TypeA)
	up.RecursionDesired = true
	resp, _, err := d.client.Exchange(up, d.p.cfg.Upstream)
	if err != nil {
		m.Rcode = dns.RcodeServerFailure
		ev.Decision, ev.Reason = "error", err.Error()
		return
	}
	m.Rcode = resp.Rcode
	var withheld []string
	check := d.p.cfg.Guard.Checker()
	for _, rr := range resp.Answer {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		// An address the proxy would never dial is not given either.
		ip, _ := netip.AddrFromSlice(a.A)
		if err := check(ip); err != nil {
			withheld = append(withheld, err.Error())
			continue
		}
		// Answer under the name asked, whatever CNAMEs led there.
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: min(a.Hdr.Ttl, 300)}, A: a.A})
	}
	ev.Decision = "allowed"
	if len(withheld) > 0 {
		ev.Reason = "answers withheld: " + strings.Join(withheld, "; ")
		if len(m.Answer) == 0 {
			ev.Decision = "denied"
		}
	}
}
