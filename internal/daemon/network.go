package daemon

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/broker"
	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netns"
	"github.com/airlock-sandbox/airlock/internal/wall"
	"github.com/airlock-sandbox/airlock/internal/spec"
)

// DefaultSubnetPool is where proxy-mode sandboxes get their /30s.
var DefaultSubnetPool = netns.DefaultPool

// network sets up proxy mode for one sandbox: the policy, the host-made
// network namespace with its veth and rules, and the proxy with its DNS
// forwarder. It points the sandbox's resolv.conf and proxy variables at
// them. done tears it all down (after the sandbox is gone) and sums up.
func (e *Engine) network(s *spec.Spec, id string, o *wall.Options, netLog io.Writer, sink func(egress.Event)) (done func() *EgressResult, err error) {
	pol, upstream, err := e.policy(s)
	if err != nil {
		return nil, err
	}
	sess, err := e.session(id, s, false)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && e.cfg.Broker != nil {
			e.cfg.Broker.End(id)
		}
	}()
	if sess != nil && sess.CAPEM() != nil {
		e.trustSandboxCA(o, sess.CAPEM())
	}
	t0 := time.Now()
	lap := func(step string) { e.cfg.Log.Debug("network", "step", step, "at", time.Since(t0)) }
	n, err := netns.Create(id, e.cfg.SubnetPool, filepath.Join(e.cfg.StateDir, "nets"), netns.Ports{
		Explicit: egress.PortExplicit, TransparentHTTP: egress.PortTransparentHTTP,
		TransparentTLS: egress.PortTransparentTLS, DNS: egress.PortDNS,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox network: %v", errdefs.ErrUnavailable, err)
	}
	lap("netns")
	stop, err := e.proxy(s, id, n, pol, upstream, netLog, sink, sess)
	if err != nil {
		return nil, err
	}
	lap("proxy")
	nsFile, err := n.File()
	if err != nil {
		stop()
		return nil, err
	}
	o.NetNS = nsFile
	proxyURL := fmt.Sprintf("http://%s:%d", n.HostIP, egress.PortExplicit)
	var env []string
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"} {
		env = append(env, k+"="+proxyURL, strings.ToLower(k)+"="+proxyURL)
	}
	env = append(env, "NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1")
	o.Env = mergeEnv(env, o.Env)
	// The grants' placeholders (minted into s.Env by the session).
	o.Env = mergeEnv(o.Env, s.Env)
	for i := range o.Files {
		if o.Files[i].Path == "etc/resolv.conf" {
			o.Files[i].Data = fmt.Sprintf("# airlock: names the egress policy allows, nothing else\nnameserver %s\noptions edns0\n", n.HostIP)
		}
	}
	return func() *EgressResult {
		nsFile.Close()
		return stop()
	}, nil
}

// policy builds a sandbox's egress policy and finds the upstream resolver.
func (e *Engine) policy(s *spec.Spec) (*egress.Policy, string, error) {
	pol := &egress.Policy{}
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
	upstream := e.cfg.DNSUpstream
	if upstream == "" {
		var err error
		if upstream, err = hostResolver(); err != nil {
			return nil, "", err
		}
	}
	return pol, upstream, nil
}

// proxy starts the egress proxy and DNS forwarder of network n; done stops
// them, drops n, and sums up. On error n is dropped.
func (e *Engine) proxy(s *spec.Spec, id string, n *netns.Net, pol *egress.Policy, upstream string, netLog io.Writer, sink func(egress.Event), sess *broker.Session) (done func() *EgressResult, err error) {
	rec := egress.NewRecorder(netLog, sink)
	cfg := egress.Config{
		Sandbox: id, Listen: n.HostIP, Interface: n.HostIf, Peer: n.SandboxIP, Policy: pol,
		Guard:    &egress.Guard{AllowNets: e.cfg.EgressAllowNets, Sandboxes: e.cfg.SubnetPool},
		Upstream: upstream, MaxConns: s.Net.MaxConns, MaxBytesOut: s.Net.EgressBytes, Recorder: rec,
	}
	if sess != nil {
		cfg.Inspector = sess
	}
	px, err := egress.Start(cfg)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	return func() *EgressResult {
		px.Close()
		res := &EgressResult{Summary: rec.Summary(), BytesOut: px.BytesOut(), DeniedPackets: n.DeniedPackets(), LimitsHit: rec.Limits()}
		if lost, err := rec.Lost(); lost > 0 {
			res.LogLost = lost
			e.cfg.Warn(fmt.Sprintf("network log incomplete: %d decisions not written (%v)", lost, err))
		}
		if err := n.Close(); err != nil {
			e.cfg.Warn("network teardown: " + err.Error())
		}
		return res
	}, nil
}

// adoptNetwork takes over the network of proxy-mode sandbox id, whose
// init (host pid) still sits in it, and starts its proxy again.
func (e *Engine) adoptNetwork(s *spec.Spec, id string, pid int) (done func() *EgressResult, err error) {
	pol, upstream, err := e.policy(s)
	if err != nil {
		return nil, err
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	sess, err := e.session(id, s, true)
	if err != nil {
		return nil, err
	}
	n, err := netns.Adopt(id, ns, e.cfg.SubnetPool, filepath.Join(e.cfg.StateDir, "nets"))
	if err != nil {
		return nil, err
	}
	return e.proxy(s, id, n, pol, upstream, io.Discard, e.cfg.OnEgress, sess)
}

// session is sandbox id's door in the broker (nil without a broker). At
// creation it mints the grants' placeholders into s.
func (e *Engine) session(id string, s *spec.Spec, adopt bool) (*broker.Session, error) {
	if e.cfg.Broker == nil {
		if len(s.Grants) > 0 {
			return nil, errdefs.Unavailable("grants need the credential broker, which this engine lacks")
		}
		return nil, nil
	}
	return e.cfg.Broker.Session(id, s, adopt)
}

// Where a sandbox finds the CA of its grants: the CA alone, and a bundle
// of the host's roots with it (for hosts it reaches through a tunnel).
const (
	sandboxCA       = "/etc/airlock/ca.pem"
	sandboxCABundle = "/etc/airlock/ca-bundle.pem"
)

// hostRoots are the host's trusted roots, the base of a sandbox's bundle.
var hostRoots = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// trustSandboxCA puts the sandbox's CA in its trust store and in the
// variables common TLS clients read.
func (e *Engine) trustSandboxCA(o *wall.Options, ca []byte) {
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
	o.Files = append(o.Files,
		wall.File{Path: strings.TrimPrefix(sandboxCA, "/"), Mode: 0o644, Data: string(ca)},
		wall.File{Path: strings.TrimPrefix(sandboxCABundle, "/"), Mode: 0o644, Data: string(bundle)},
		// Debian's and most images' system bundle, for clients that read
		// no variable.
		wall.File{Path: "etc/ssl/certs/ca-certificates.crt", Link: sandboxCABundle},
	)
	o.Env = mergeEnv(o.Env, []string{
		"SSL_CERT_FILE=" + sandboxCABundle, "REQUESTS_CA_BUNDLE=" + sandboxCABundle, "CURL_CA_BUNDLE=" + sandboxCABundle,
		"GIT_SSL_CAINFO=" + sandboxCABundle, "NODE_EXTRA_CA_CERTS=" + sandboxCA,
	})
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
