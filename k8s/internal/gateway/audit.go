package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
)

// audit answers GET /v1/namespaces/{ns}/audit: the records of tenant ns
// on every node, merged by time, each with a "node" field naming where it
// was written. ?sandbox=NAME narrows it to one Sandbox (on its node);
// kind, trigger and since go to the daemons as they are (docs/api.md).
// Nodes that did not answer are named in X-Airlock-Audit-Unreachable; a
// node where the tenant never was has no records.
func (s *Server) audit(w http.ResponseWriter, r *http.Request) {
	ns := r.PathValue("ns")
	if !namespaceRE.MatchString(ns) {
		writeError(w, api.CodeNotFound, "no such namespace")
		return
	}
	if !s.caller(w, r, access{Verb: "get", Namespace: ns, Subresource: "audit"}) {
		return
	}
	q := url.Values{}
	for _, k := range []string{"kind", "trigger", "since"} {
		if v := r.URL.Query().Get(k); v != "" {
			q.Set(k, v)
		}
	}
	targets := s.dir.Nodes()
	if name := r.URL.Query().Get("sandbox"); name != "" {
		sb, ok := s.dir.Sandbox(ns, name)
		n, nok := s.dir.Node(sb.Node)
		if !ok || !nok || !sandboxIDRE.MatchString(sb.ID) {
			writeError(w, api.CodeNotFound, fmt.Sprintf("no sandbox %q in namespace %s", name, ns))
			return
		}
		targets = []Node{n}
		q.Set("sandbox", sb.ID)
	}
	master, err := s.master(r.Context())
	if err != nil {
		s.fail(w, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var (
		streams     []*auditStream
		unreachable []string
	)
	for _, n := range targets {
		st, err := s.openAudit(ctx, n, nodes.TenantKey(master, n.Name, ns), q)
		if err != nil {
			s.log.Warn("gateway: audit", "node", n.Name, "err", err)
			unreachable = append(unreachable, n.Name)
			continue
		}
		if st != nil {
			defer st.close()
			streams = append(streams, st)
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	if len(unreachable) > 0 {
		w.Header().Set("X-Airlock-Audit-Unreachable", strings.Join(unreachable, ","))
	}
	w.Header().Set("Trailer", "X-Airlock-Audit-Cut")
	w.WriteHeader(http.StatusOK)
	// Each node's records come in its own order (by seq, so by time); the
	// merge takes the earliest head of all streams, one record at a time.
	for _, st := range streams {
		st.advance()
	}
	enc := json.NewEncoder(w)
	for {
		var next *auditStream
		for _, st := range streams {
			if st.head != nil && (next == nil || st.at.Before(next.at)) {
				next = st
			}
		}
		if next == nil {
			break
		}
		if err := enc.Encode(next.head); err != nil {
			return
		}
		next.advance()
	}
	// A node whose stream broke off: the records so far were sent; the
	// trailer names it.
	var cut []string
	for _, st := range streams {
		if st.err != nil {
			s.log.Warn("gateway: audit stream cut", "node", st.node, "err", st.err)
			cut = append(cut, st.node)
		}
	}
	if len(cut) > 0 {
		w.Header().Set("X-Airlock-Audit-Cut", strings.Join(cut, ","))
	}
}

// auditStream is one node's answer, read a record at a time.
type auditStream struct {
	node string
	res  *http.Response
	sc   *bufio.Scanner
	head map[string]json.RawMessage // the next record, tagged with its node; nil at the end
	at   time.Time
	err  error
}

// openAudit asks one node for the tenant's records. A node where the
// tenant's key is unknown (the tenant never had a sandbox there) has none:
// nil, nil.
func (s *Server) openAudit(ctx context.Context, n Node, key string, q url.Values) (*auditStream, error) {
	nc, err := s.conns.get(n)
	if err != nil {
		return nil, err
	}
	u := nc.base.String() + "/v1/audit"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := nc.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	switch res.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		res.Body.Close()
		return nil, nil
	default:
		res.Body.Close()
		return nil, fmt.Errorf("HTTP %d", res.StatusCode)
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	return &auditStream{node: n.Name, res: res, sc: sc}, nil
}

func (st *auditStream) advance() {
	st.head = nil
	if st.err != nil || !st.sc.Scan() {
		if st.err == nil {
			st.err = st.sc.Err()
		}
		return
	}
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(st.sc.Bytes(), &rec); err != nil {
		st.err = fmt.Errorf("bad record: %w", err)
		return
	}
	var at time.Time
	if err := json.Unmarshal(rec["time"], &at); err != nil {
		st.err = fmt.Errorf("bad record time: %w", err)
		return
	}
	node, _ := json.Marshal(st.node)
	rec["node"] = node
	st.head, st.at = rec, at
}

func (st *auditStream) close() { st.res.Body.Close() }
