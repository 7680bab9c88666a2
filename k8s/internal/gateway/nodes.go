package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// nodeConn is how the gateway reaches one daemon.
type nodeConn struct {
	endpoint string
	ca       string
	base     *url.URL // scheme and host of every request to it
	rt       *http.Transport
}

// conns keeps one transport per node, made again when the node's
// endpoint or CA changes.
type conns struct {
	mu sync.Mutex
	m  map[string]*nodeConn
}

func (c *conns) get(n Node) (*nodeConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nc := c.m[n.Name]; nc != nil && nc.endpoint == n.Endpoint && nc.ca == string(n.CABundle) {
		return nc, nil
	}
	nc, err := dialNode(n)
	if err != nil {
		return nil, err
	}
	if old := c.m[n.Name]; old != nil {
		old.rt.CloseIdleConnections()
	}
	if c.m == nil {
		c.m = map[string]*nodeConn{}
	}
	c.m[n.Name] = nc
	return nc, nil
}

// dialNode makes the transport for a node's endpoint: unix:///path or
// https://host:port (trusting only caBundle when it is set). Never plain
// http: the tenant key would cross the network in the clear.
func dialNode(n Node) (*nodeConn, error) {
	tr := &http.Transport{
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // an exec's headers come when its command starts
	}
	nc := &nodeConn{endpoint: n.Endpoint, ca: string(n.CABundle), rt: tr}
	switch {
	case strings.HasPrefix(n.Endpoint, "unix://"):
		sock := strings.TrimPrefix(n.Endpoint, "unix://")
		if !strings.HasPrefix(sock, "/") {
			return nil, fmt.Errorf("node %s: endpoint %q: want an absolute socket path", n.Name, n.Endpoint)
		}
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
		nc.base = &url.URL{Scheme: "http", Host: "airlock"}
	case strings.HasPrefix(n.Endpoint, "https://"):
		u, err := url.Parse(n.Endpoint)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("node %s: endpoint %q: not a URL", n.Name, n.Endpoint)
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if len(n.CABundle) > 0 {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(n.CABundle) {
				return nil, fmt.Errorf("node %s: caBundle holds no PEM certificate", n.Name)
			}
			cfg.RootCAs = pool
		}
		tr.TLSClientConfig = cfg
		nc.base = &url.URL{Scheme: "https", Host: u.Host}
	default:
		return nil, fmt.Errorf("node %s: endpoint %q: want unix:// or https://", n.Name, n.Endpoint)
	}
	return nc, nil
}

var errNoNode = errors.New("node not registered")
