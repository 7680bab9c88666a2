// Package dns is a sandbox's DNS forwarder: it answers A queries for the
// names its policy allows, from the upstream resolver, withholding every
// address the guard refuses; AAAA gets an empty answer and every other
// type is refused. Each query is an eventlog.Event. It imports
// internal/egress/policy, internal/egress/eventlog and miekg/dns.
package dns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/egress/policy"
)

// Config describes one sandbox's forwarder.
type Config struct {
	Addr   string            // host:port to serve, UDP and TCP
	Listen *net.ListenConfig // how to bind (the proxy's: on the sandbox's veth only)
	// FromPeer says whether a query comes from the sandbox: others are
	// dropped unanswered and not recorded.
	FromPeer func(net.Addr) bool
	Policy   *policy.Policy
	Guard    *policy.Guard
	Upstream string               // the resolver asked (host:port)
	Record   func(eventlog.Event) // every query's decision
}

// Server is the sandbox's resolver: it answers A queries for names the
// policy allows (from the upstream resolver), gives empty answers to AAAA
// (the sandbox has no IPv6), refuses every other type (no TXT or NULL
// channel), and answers NXDOMAIN for everything else without asking
// upstream. UDP and TCP.
type Server struct {
	cfg     Config
	servers []*dns.Server
	client  *dns.Client
}

// Start binds the forwarder's UDP and TCP sockets and serves them.
func Start(cfg Config) (*Server, error) {
	d := &Server{cfg: cfg, client: &dns.Client{Timeout: 5 * time.Second}}
	pc, err := cfg.Listen.ListenPacket(context.Background(), "udp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("dns forwarder: %w", err)
	}
	ln, err := cfg.Listen.Listen(context.Background(), "tcp", cfg.Addr)
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

// Close stops serving.
func (d *Server) Close() {
	for _, s := range d.servers {
		_ = s.Shutdown()
	}
}

// ServeDNS answers one query.
func (d *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	if !d.cfg.FromPeer(w.RemoteAddr()) {
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
	ev := eventlog.Event{Kind: "dns", Host: name, QType: dns.TypeToString[q.Qtype]}
	defer func() {
		ev.DurationMS = float64(time.Since(start).Microseconds()) / 1000
		d.cfg.Record(ev)
	}()
	dec := d.cfg.Policy.AllowsName(name)
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
	resp, _, err := d.client.Exchange(up, d.cfg.Upstream)
	if err != nil {
		m.Rcode = dns.RcodeServerFailure
		ev.Decision, ev.Reason = "error", err.Error()
		return
	}
	m.Rcode = resp.Rcode
	var withheld []string
	check := d.cfg.Guard.Checker()
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
