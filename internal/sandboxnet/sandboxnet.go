// Package sandboxnet is the network of one proxy-mode sandbox: the policy,
// a host-made network namespace with its veth, /30 and nftables rules
// (internal/netns), the egress proxy and DNS forwarder on the veth's host
// end (internal/egress), and the sandbox's door in the credential broker
// (internal/broker): its grants' placeholders and the CA it trusts. The
// same for every wall: a wall only joins the namespace it is given.
package sandboxnet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/egress/eventlog"
	"github.com/airlock-sandbox/airlock/internal/egress/policy"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netns"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/wall"
)

// DefaultSubnetPool is where proxy-mode sandboxes get their /30s.
var DefaultSubnetPool = netns.DefaultPool

// Config is the host's side of every sandbox network.
type Config struct {
	StateDir string // leases of /30s live under StateDir/nets
	Log      *slog.Logger
	Warn     func(string)
	// DNSUpstream is the resolver the proxy and DNS forwarder ask
	// (host:port); default: the first nameserver of /etc/resolv.conf.
	DNSUpstream string
	SubnetPool  netip.Prefix
	// EgressAllowNets are ranges of the guard's table the operator opens
	// to every sandbox's proxy (never the host's own or the pool).
	EgressAllowNets []netip.Prefix
	// Broker keeps grants and inspects what the proxy can read; without
	// it grants are refused.
	Broker *broker.Broker
}

// Result sums up a sandbox's network activity.
type Result struct {
	Summary       string   `json:"summary"`
	BytesOut      int64    `json:"bytes_out"`
	DeniedPackets uint64   `json:"denied_packets"`
	LimitsHit     []string `json:"limits_hit,omitempty"`
	// LogLost counts decisions the network log could not record.
	LogLost int `json:"log_lost,omitempty"`
}

// Net is one sandbox's network, up.
type Net struct {
	// NetNS is the namespace the sandbox joins.
	NetNS *os.File
	// Env are the proxy's variables (the sandbox's own override them);
	// TrustEnv point TLS clients at the grants' CA (they override the
	// image's); Files are resolv.conf and the CA's files.
	Env, TrustEnv []string
	Files         []wall.File

	once   sync.Once
	result *Result
	stop   func() *Result
}

// Guard is the address guard every sandbox's proxy and the registry
// dialer share: c's allowed ranges, never the sandboxes' pool.
func (c *Config) Guard() *policy.Guard {
	return &policy.Guard{AllowNets: c.EgressAllowNets, Sandboxes: c.pool()}
}

// RegistryDial dials a registry only at an address the guard allows (never
// the host's own, a sandbox's, loopback, private, link-local or metadata;
// the operator's EgressAllowNets open as for sandboxes), after DNS.
func (c *Config) RegistryDial() func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Control: c.Guard().Control}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if errors.Is(err, policy.ErrBlockedAddress) {
			return nil, fmt.Errorf("%w: %v", errdefs.ErrPermissionDenied, err)
		}
		return conn, err
	}
}

func (c *Config) pool() netip.Prefix {
	if !c.SubnetPool.IsValid() {
		return DefaultSubnetPool
	}
	return c.SubnetPool
}

func (c *Config) warn(m string) {
	if c.Warn != nil {
		c.Warn(m)
	}
}

// Setup brings up sandbox id's network for spec s: the namespace, the
// proxy, the broker's session (which mints the grants' placeholders into
// s.Env). netLog receives one JSON line per decision; sink sees every
// decision as it is made.
func Setup(c *Config, id string, s *spec.Spec, netLog io.Writer, sink func(eventlog.Event)) (_ *Net, err error) {
	pol, upstream, err := c.policy(s)
	if err != nil {
		return nil, err
	}
	sess, err := c.session(id, s, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && c.Broker != nil {
			c.Broker.End(id)
		}
	}()
	t0 := time.Now()
	// Only the container wall's sandboxes send through the namespace's
	// own IP stack, whose rules judge them; any other wall's (gVisor's
	// netstack writes frames on the veth itself) are judged on the host
	// end of the veth too.
	n, err := netns.Create(id, c.pool(), LeaseDir(c.StateDir), netns.Ports{
		Explicit: egress.PortExplicit, TransparentHTTP: egress.PortTransparentHTTP,
		TransparentTLS: egress.PortTransparentTLS, DNS: egress.PortDNS,
	}, s.Wall() != "container")
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox network: %v", errdefs.ErrUnavailable, err)
	}
	if c.Log != nil {
		c.Log.Debug("network", "step", "netns", "at", time.Since(t0))
	}
	stop, err := c.proxy(s, id, n, pol, upstream, netLog, sink, sess)
	if err != nil {
		return nil, err
	}
	nsFile, err := n.File()
	if err != nil {
		stop()
		return nil, err
	}
	out := &Net{NetNS: nsFile, stop: func() *Result { nsFile.Close(); return c.end(id, stop) }}
	proxyURL := fmt.Sprintf("http://%s:%d", n.HostIP, egress.PortExplicit)
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"} {
		out.Env = append(out.Env, k+"="+proxyURL, strings.ToLower(k)+"="+proxyURL)
	}
	out.Env = append(out.Env, "NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1")
	out.Files = append(out.Files, wall.File{Path: "etc/resolv.conf", Mode: 0o644,
		Data: fmt.Sprintf("# airlock: names the egress policy allows, nothing else\nnameserver %s\noptions edns0\n", n.HostIP)})
	if sess != nil && sess.CAPEM() != nil {
		files, env := trust(sess.CAPEM())
		out.Files, out.TrustEnv = append(out.Files, files...), env
	}
	return out, nil
}

// Adopt takes over the network of proxy-mode sandbox id, whose init (host
// pid) still sits in it, and starts its proxy again; the connections
// through the old proxy were cut.
func Adopt(c *Config, id string, s *spec.Spec, pid int, sink func(eventlog.Event)) (*Net, error) {
	pol, upstream, err := c.policy(s)
	if err != nil {
		return nil, err
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	sess, err := c.session(id, s, true)
	if err != nil {
		return nil, err
	}
	n, err := netns.Adopt(id, ns, c.pool(), LeaseDir(c.StateDir))
	if err != nil {
		return nil, err
	}
	stop, err := c.proxy(s, id, n, pol, upstream, io.Discard, sink, sess)
	if err != nil {
		return nil, err
	}
	return &Net{stop: func() *Result { return c.end(id, stop) }}, nil
}

// end stops the proxy and ends the sandbox's broker session: every token
// it held is refused from then on.
func (c *Config) end(id string, stop func() *Result) *Result {
	res := stop()
	if c.Broker != nil {
		c.Broker.End(id)
	}
	return res
}

// Reap removes the leases, and the host side's rules, of sandboxes that
// are gone.
func Reap(stateDir string) error { return netns.Reap(LeaseDir(stateDir)) }

// LeaseDir is where the /30 leases of state directory stateDir live.
func LeaseDir(stateDir string) string { return filepath.Join(stateDir, "nets") }

// Close stops the proxy, removes the namespace, ends the broker session
// and sums up; later calls return the same result. Call it once the
// sandbox is gone.
func (n *Net) Close() *Result {
	n.once.Do(func() { n.result = n.stop() })
	return n.result
}

// policy builds a sandbox's egress policy and finds the upstream resolver.
func (c *Config) policy(s *spec.Spec) (*policy.Policy, string, error) {
	pol := &policy.Policy{}
	if err := pol.Add(true, s.Net.Allow...); err != nil {
		return nil, "", errdefs.Invalid("--allow: " + err.Error())
	}
	if err := pol.Add(false, s.Net.Deny...); err != nil {
		return nil, "", errdefs.Invalid("--deny: " + err.Error())
	}
	if s.Net.PolicyFile != "" {
		if err := pol.LoadFile(s.Net.PolicyFile); err != nil {
			return nil, "", errdefs.Invalid(err.Error())
		}
	}
	// A grant's host is reachable on its port (a deny rule still wins).
	for _, g := range s.Grants {
		if err := pol.Add(true, net.JoinHostPort(g.Host, strconv.Itoa(g.Port))); err != nil {
			return nil, "", errdefs.Invalid("grant: " + err.Error())
		}
	}
	upstream := c.DNSUpstream
	if upstream == "" {
		var err error
		if upstream, err = hostResolver(); err != nil {
			return nil, "", err
		}
	}
	return pol, upstream, nil
}

// proxy starts the egress proxy and DNS forwarder of network n; stop
// stops them, drops n, and sums up. On error n is dropped.
func (c *Config) proxy(s *spec.Spec, id string, n *netns.Net, pol *policy.Policy, upstream string, netLog io.Writer, sink func(eventlog.Event), sess *broker.Session) (stop func() *Result, err error) {
	rec := eventlog.NewRecorder(netLog, sink)
	cfg := egress.Config{
		Sandbox: id, Listen: n.HostIP, Interface: n.HostIf, Peer: n.SandboxIP, Policy: pol,
		Guard: c.Guard(), Upstream: upstream, MaxConns: s.Net.MaxConns, MaxBytesOut: s.Net.EgressBytes, Recorder: rec,
	}
	if sess != nil {
		cfg.Inspector = sess
	}
	px, err := egress.Start(cfg)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return func() *Result {
		px.Close()
		res := &Result{Summary: rec.Summary(), BytesOut: px.BytesOut(), DeniedPackets: n.DeniedPackets(), LimitsHit: rec.Limits()}
		if lost, err := rec.Lost(); lost > 0 {
			res.LogLost = lost
			c.warn(fmt.Sprintf("network log incomplete: %d decisions not written (%v)", lost, err))
		}
		if err := n.Close(); err != nil {
			c.warn("network teardown: " + err.Error())
		}
		return res
	}, nil
}

// session is sandbox id's door in the broker (nil without a broker). At
// creation it mints the grants' placeholders into s.
func (c *Config) session(id string, s *spec.Spec, adopt bool) (*broker.Session, error) {
	if c.Broker == nil {
		if len(s.Grants) > 0 {
			return nil, errdefs.Unavailable("grants need the credential broker, which this host lacks")
		}
		return nil, nil
	}
	return c.Broker.Session(id, s, adopt)
}

// Where a sandbox finds the CA of its grants: the CA alone, and a bundle
// of the host's roots with it (for hosts it reaches through a tunnel).
const (
	sandboxCA       = "/etc/airlock/ca.pem"
	sandboxCABundle = "/etc/airlock/ca-bundle.pem"
)

// hostRoots are the host's trusted roots, the base of a sandbox's bundle.
var hostRoots = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// trust puts the sandbox's CA in its trust store and in the variables
// common TLS clients read.
func trust(ca []byte) ([]wall.File, []string) {
	var bundle []byte
	for _, p := range hostRoots {
		if b, err := os.ReadFile(p); err == nil {
			bundle = b
			break
		}
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, ca...)
	return []wall.File{
			{Path: strings.TrimPrefix(sandboxCA, "/"), Mode: 0o644, Data: string(ca)},
			{Path: strings.TrimPrefix(sandboxCABundle, "/"), Mode: 0o644, Data: string(bundle)},
			// Debian's and most images' system bundle, for clients that
			// read no variable.
			{Path: "etc/ssl/certs/ca-certificates.crt", Link: sandboxCABundle},
		}, []string{
			"SSL_CERT_FILE=" + sandboxCABundle, "REQUESTS_CA_BUNDLE=" + sandboxCABundle, "CURL_CA_BUNDLE=" + sandboxCABundle,
			"GIT_SSL_CAINFO=" + sandboxCABundle, "NODE_EXTRA_CA_CERTS=" + sandboxCA,
		}
}

// hostResolver is the first nameserver of the host's /etc/resolv.conf.
func hostResolver() (string, error) {
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return "", fmt.Errorf("%w: no DNS resolver for the egress proxy: %v", errdefs.ErrUnavailable, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				return net.JoinHostPort(a.String(), "53"), nil
			}
		}
	}
	return "", errdefs.Unavailable("no nameserver in /etc/resolv.conf for the egress proxy")
}
