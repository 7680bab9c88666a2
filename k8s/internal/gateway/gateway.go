// Package gateway is airlock's data plane on Kubernetes: it lets a
// Kubernetes identity reach the sandboxes behind agent-sandbox's Sandbox
// objects (exec, files, processes, ports) and read its namespace's audit
// records, with Kubernetes RBAC deciding who may (docs/kubernetes.md).
//
// A request carries a bearer token; the apiserver says who it is
// (TokenReview) and whether they may touch that Sandbox's subresource
// (SubjectAccessReview on agents.x-k8s.io sandboxes/<subresource>); the
// Sandbox's annotations say which node holds it under which daemon id;
// the request goes on to that daemon with the namespace's tenant key in
// place of the caller's token. It is imported only by cmd/airlock-gateway.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/k8s/internal/nodes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// subresources are the daemon's per-sandbox routes the gateway forwards,
// by first path segment after /v1/sandboxes/{id}/ (docs/api.md). Each is
// also the RBAC subresource checked. What is not here is refused 404:
// a sandbox's lifecycle belongs to its Sandbox object.
var subresources = map[string]string{
	"exec":      "run a command",
	"processes": "list, attach to, feed, signal, resize its processes",
	"files":     "read, write, remove files",
	"stat":      "a file's metadata",
	"dir":       "list a directory",
	"mkdir":     "make a directory",
	"move":      "rename a file",
	"edit":      "replace text in a file",
	"watch":     "stream file changes",
	"archive":   "upload or download a tar archive",
	"diff":      "the sandbox's changes as a patch",
	"ports":     "HTTP to a server inside the sandbox",
	"tunnel":    "a raw TCP tunnel to a port inside the sandbox",
	// Not forwarded, on purpose:
	//   pause, resume, extend: lifecycle, which the Sandbox's spec drives;
	//   fork: makes daemon sandboxes the cluster does not know of;
	//   snapshot: a tenant-wide object with no Kubernetes kind;
	//   port-tokens: its URLs name the node, which callers cannot reach.
}

// Config is what a gateway needs.
type Config struct {
	Kube      kubernetes.Interface // TokenReview, SubjectAccessReview
	Directory Directory
	// Master returns the key from which every tenant key is derived
	// (Secret airlock-system/airlock-master, key master).
	Master func(context.Context) ([]byte, error)
	// ReviewTTL is how long a review's answer is reused (default 10s);
	// CacheSize bounds each cache (default 10000 entries).
	ReviewTTL time.Duration
	CacheSize int
	Now       func() time.Time // default time.Now
	Log       *slog.Logger
}

// Server is the gateway's HTTP handler.
type Server struct {
	dir      Directory
	master   func(context.Context) ([]byte, error)
	reviews  *reviewer
	owned    *ttlCache[bool] // node, daemon id, Sandbox UIDs → the daemon sandbox is this Sandbox's
	conns    conns
	now      func() time.Time
	log      *slog.Logger
	mux      *http.ServeMux
	ownedTTL time.Duration
}

// New returns a gateway.
func New(c Config) *Server {
	if c.ReviewTTL == 0 {
		c.ReviewTTL = 10 * time.Second
	}
	if c.CacheSize == 0 {
		c.CacheSize = 10000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		dir:      c.Directory,
		master:   c.Master,
		reviews:  newReviewer(c.Kube, c.ReviewTTL, c.CacheSize, c.Now),
		owned:    newTTLCache[bool](c.CacheSize),
		ownedTTL: time.Hour,
		now:      c.Now,
		log:      c.Log,
		mux:      http.NewServeMux(),
	}
	s.mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`+"\n")
	})
	s.mux.HandleFunc("/v1/namespaces/{ns}/sandboxes/{name}", s.sandbox)
	s.mux.HandleFunc("/v1/namespaces/{ns}/sandboxes/{name}/{rest...}", s.sandbox)
	s.mux.HandleFunc("GET /v1/namespaces/{ns}/audit", s.audit)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, api.CodeNotFound, "no route "+r.Method+" "+r.URL.Path)
	})
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

var (
	// A namespace is a DNS-1123 label; a Sandbox's name a DNS-1123 subdomain.
	namespaceRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	nameRE      = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)
	// A daemon sandbox id, as the annotation may hold it (the daemon's ids
	// are narrower; this keeps the path ours).
	sandboxIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)
)

// caller authenticates r and asks whether it may have a. It writes the
// refusal itself and returns ok=false when not.
func (s *Server) caller(w http.ResponseWriter, r *http.Request, a access) bool {
	token, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !found || token == "" {
		writeError(w, api.CodeUnauthenticated, "a Kubernetes bearer token is required")
		return false
	}
	tk := tokenKey(token)
	u, err := s.reviews.authenticate(r.Context(), tk, token)
	if err != nil {
		s.log.Error("token review", "err", err)
		writeError(w, api.CodeUnavailable, "the apiserver did not answer the token review")
		return false
	}
	if u == nil {
		writeError(w, api.CodeUnauthenticated, "the token is not valid")
		return false
	}
	ok, err := s.reviews.authorize(r.Context(), tk, u, a)
	if err != nil {
		s.log.Error("access review", "err", err)
		writeError(w, api.CodeUnavailable, "the apiserver did not answer the access review")
		return false
	}
	if !ok {
		what := "sandboxes"
		if a.Subresource != "" {
			what += "/" + a.Subresource
		}
		writeError(w, api.CodePermissionDenied, fmt.Sprintf("%s may not %s %s.%s in namespace %s", u.Username, a.Verb, what, sandboxGroup, a.Namespace))
		return false
	}
	return true
}

// sandbox forwards ANY /v1/namespaces/{ns}/sandboxes/{name}/{rest...} to
// the daemon that holds the Sandbox.
func (s *Server) sandbox(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("ns"), r.PathValue("name")
	if !namespaceRE.MatchString(ns) || !nameRE.MatchString(name) {
		writeError(w, api.CodeNotFound, "no such sandbox")
		return
	}
	// The rest of the path as the caller escaped it (a port's path may
	// hold %2F), with no dot segment either as sent or once decoded
	// ("..%2F.."): the daemon's router would resolve one to another of
	// the sandbox's routes, or another sandbox's.
	rest, found := strings.CutPrefix(r.URL.EscapedPath(), "/v1/namespaces/"+ns+"/sandboxes/"+name)
	if !found || (rest != "" && !strings.HasPrefix(rest, "/")) {
		writeError(w, api.CodeNotFound, "no route "+r.URL.Path)
		return
	}
	sub := ""
	if rest != "" {
		segs := strings.Split(rest[1:], "/")
		for i, seg := range segs {
			dec, err := url.PathUnescape(seg)
			if err != nil || (i == 0 && dec != seg) || slices.ContainsFunc(strings.Split(dec, "/"), isDotSegment) {
				writeError(w, api.CodeInvalidArgument, "bad path")
				return
			}
		}
		sub = segs[0]
		if _, ok := subresources[sub]; !ok {
			writeError(w, api.CodeNotFound, fmt.Sprintf("the gateway does not forward %q", sub))
			return
		}
	} else if r.Method != http.MethodGet && r.Method != http.MethodHead {
		// The sandbox itself is read here; it is made and ended through
		// its Sandbox object.
		writeError(w, api.CodeInvalidArgument, "method "+r.Method+" not allowed: change the Sandbox object instead")
		return
	}
	verb := "create"
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		verb = "get"
	}
	if !s.caller(w, r, access{Verb: verb, Namespace: ns, Subresource: sub, Name: name}) {
		return
	}
	sb, ok := s.dir.Sandbox(ns, name)
	if !ok || sb.Node == "" || !sandboxIDRE.MatchString(sb.ID) {
		writeError(w, api.CodeNotFound, fmt.Sprintf("no sandbox %q in namespace %s (or not placed yet)", name, ns))
		return
	}
	nc, key, err := s.nodeFor(r.Context(), sb.Node, ns)
	if err != nil {
		s.fail(w, err)
		return
	}
	if err := s.checkOwned(r.Context(), nc, key, sb); err != nil {
		s.fail(w, err)
		return
	}
	s.forward(w, r, nc, key, sb.Node, "/v1/sandboxes/"+sb.ID+rest)
}

func isDotSegment(s string) bool { return s == "." || s == ".." }

// errNotOwned says the daemon sandbox an annotation names is not the
// Sandbox's: answered as a missing sandbox.
var errNotOwned = errors.New("not this Sandbox's")

// checkOwned makes sure the daemon sandbox sb.ID on the node was made for
// this Sandbox (its external_id is the Sandbox's UID, or its claim's),
// since whoever may edit a Sandbox may point its annotations at another
// sandbox of the namespace. The answer never changes for a given
// (node, id, UIDs), so it is remembered.
func (s *Server) checkOwned(ctx context.Context, nc *nodeConn, key string, sb Sandbox) error {
	ck := strings.Join(append([]string{sb.Node, sb.ID, sb.UID}, sb.OwnerUIDs...), "\x00")
	if _, ok := s.owned.get(ck, s.now()); ok {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, nc.base.String()+"/v1/sandboxes/"+sb.ID, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := nc.rt.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("node %s: %w", sb.Node, err)
	}
	defer res.Body.Close()
	switch res.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusUnauthorized:
		// Not this tenant's, gone, or the tenant is unknown there.
		return errNotOwned
	default:
		return fmt.Errorf("node %s: HTTP %d", sb.Node, res.StatusCode)
	}
	var got struct {
		ExternalID string `json:"external_id"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&got); err != nil {
		return fmt.Errorf("node %s: %w", sb.Node, err)
	}
	if got.ExternalID == "" || (got.ExternalID != sb.UID && !slices.Contains(sb.OwnerUIDs, got.ExternalID)) {
		return errNotOwned
	}
	s.owned.put(ck, true, s.now(), s.ownedTTL)
	return nil
}

// nodeFor returns the connection to a node and the tenant key of ns there.
func (s *Server) nodeFor(ctx context.Context, node, ns string) (*nodeConn, string, error) {
	n, ok := s.dir.Node(node)
	if !ok {
		return nil, "", fmt.Errorf("%w: %s", errNoNode, node)
	}
	nc, err := s.conns.get(n)
	if err != nil {
		return nil, "", err
	}
	master, err := s.master(ctx)
	if err != nil {
		return nil, "", err
	}
	return nc, nodes.TenantKey(master, node, ns), nil
}

// fail answers an error that is the gateway's or a node's, not the caller's.
func (s *Server) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errNotOwned):
		writeError(w, api.CodeNotFound, "no such sandbox")
	default:
		s.log.Warn("gateway", "err", err)
		writeError(w, api.CodeUnavailable, err.Error())
	}
}

// forward proxies r to path on the node, as the tenant: the caller's
// Authorization never goes on; streams are flushed as they come; an
// Upgrade (a port's WebSocket, a tunnel) is relayed both ways.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, nc *nodeConn, key, node, escapedPath string) {
	path, err := url.PathUnescape(escapedPath)
	if err != nil {
		writeError(w, api.CodeInvalidArgument, "bad path")
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = nc.base.Scheme
			pr.Out.URL.Host = nc.base.Host
			pr.Out.URL.Path = path
			pr.Out.URL.RawPath = escapedPath
			pr.Out.Host = nc.base.Host
			pr.Out.Header.Set("Authorization", "Bearer "+key)
		},
		Transport:     nc.rt,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the caller went away
			}
			s.log.Warn("gateway: node unreachable", "node", node, "err", err)
			writeError(w, api.CodeUnavailable, "node "+node+" did not answer")
		},
	}
	rp.ServeHTTP(w, r)
}

func writeError(w http.ResponseWriter, code api.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code.Status())
	json.NewEncoder(w).Encode(&api.Error{Code: code, Message: msg})
}

// SecretMaster returns a Config.Master that reads the master key from
// Secret namespace/airlock-master (key master), and keeps it once read: the
// controller makes it once and never changes it. The gateway never makes
// it: until the controller has, requests answer unavailable.
func SecretMaster(kube kubernetes.Interface, namespace string) func(context.Context) ([]byte, error) {
	var (
		mu     sync.Mutex
		master []byte
	)
	return func(ctx context.Context) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if master != nil {
			return master, nil
		}
		sec, err := kube.CoreV1().Secrets(namespace).Get(ctx, MasterSecret, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("secret %s/%s does not exist yet (the controller makes it)", namespace, MasterSecret)
		}
		if err != nil {
			return nil, fmt.Errorf("secret %s/%s: %w", namespace, MasterSecret, err)
		}
		// The controller's rule (nodes.Tracker.Master), so that both
		// derive keys from the same master or neither does.
		if m := sec.Data[nodes.MasterKey]; len(m) < 16 {
			return nil, fmt.Errorf("secret %s/%s: key %s holds %d bytes, want at least 16", namespace, MasterSecret, nodes.MasterKey, len(m))
		}
		master = sec.Data[nodes.MasterKey]
		return master, nil
	}
}

// MasterSecret is the name of the Secret holding the tenant-key master.
const MasterSecret = "airlock-master"
