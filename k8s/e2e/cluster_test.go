package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "github.com/airlock-sandbox/airlock/k8s/api/v1alpha1"
)

// The identities of the token file. Every one but alice and mallory is in
// system:masters.
const (
	userAdmin      = "admin"
	userController = "airlock-controller"
	userGateway    = "airlock-gateway"
	userNode       = "airlock-node"
	userAlice      = "alice"   // may use sandboxes in namespace a only (RBAC)
	userMallory    = "mallory" // authenticated, no RBAC at all
)

// systemNamespace holds the nodes' admin-key Secrets and the master Secret.
const systemNamespace = "airlock-system"

// cluster is everything TestMain started.
type cluster struct {
	dir      string // the run's directory; removed at the end
	binDir   string // airlock, airlock-init and the k8s module's commands
	kubeBin  string
	lock     *os.File
	pki      *pki
	tokens   map[string]string // user → bearer token
	apiURL   string
	cfg      *rest.Config // admin's
	c        client.WithWatch
	scheme   *runtime.Scheme
	etcd     *proc
	api      *proc
	nodes    []*node
	crdPaths []string

	controller *proc
	gateway    *proc
	gatewayURL string
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, v1alpha1.AddToScheme, sandboxv1beta1.AddToScheme, extv1beta1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}

// startCluster starts the control plane, installs the CRDs and RBAC, builds
// airlock's binaries and starts the nodes. On error it returns what it
// started so far, for stop.
func startCluster(kubeBin string) (*cluster, error) {
	dir, err := os.MkdirTemp("", suitePrefix)
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir, kubeBin: kubeBin, binDir: filepath.Join(dir, "bin"), scheme: newScheme(), tokens: map[string]string{}}
	env = c
	// The run's claim on its directory, before anything else: a run
	// starting meanwhile reaps only directories whose owner is gone.
	if c.lock, err = os.Create(filepath.Join(dir, "owner.lock")); err != nil {
		return c, err
	}
	if err := syscall.Flock(int(c.lock.Fd()), syscall.LOCK_EX); err != nil {
		return c, err
	}
	// Sandboxes' unprivileged roots traverse the daemons' state directories.
	if err := os.Chmod(dir, 0o711); err != nil {
		return c, err
	}
	for _, d := range []string{"logs", "bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return c, err
		}
	}
	if err := c.build(); err != nil {
		return c, err
	}
	if err := c.buildK8s(); err != nil {
		return c, err
	}
	reapStaleRuns(dir, c.bin("airlock"))
	if c.pki, err = newPKI(filepath.Join(dir, "pki")); err != nil {
		return c, err
	}
	if err := c.startControlPlane(); err != nil {
		return c, err
	}
	if err := c.installCRDs(); err != nil {
		return c, err
	}
	if err := c.setupAccess(); err != nil {
		return c, err
	}
	if err := c.startNodes(); err != nil {
		return c, err
	}
	for _, n := range c.nodes {
		if err := c.register(n); err != nil {
			return c, err
		}
	}
	if err := c.startController(); err != nil {
		return c, err
	}
	if err := c.startGateway(); err != nil {
		return c, err
	}
	if err := c.gatewayUp(); err != nil {
		return c, err
	}
	return c, c.nodesReady()
}

func (c *cluster) bin(name string) string { return filepath.Join(c.binDir, name) }
func (c *cluster) logPath(name string) string {
	return filepath.Join(c.dir, "logs", name+".log")
}

// build compiles the main module's airlock and airlock-init (airlock runs
// the init beside it in every sandbox) and the k8s module's commands.
func (c *cluster) build() error {
	k8sDir, err := filepath.Abs("..")
	if err != nil {
		return err
	}
	for _, b := range []struct {
		dir, out string
		pkgs     []string
	}{
		{filepath.Dir(k8sDir), c.bin("airlock"), []string{"./cmd/airlock"}},
		{filepath.Dir(k8sDir), c.bin("airlock-init"), []string{"./cmd/airlock-init"}},
	} {
		cmd := exec.Command("go", append([]string{"build", "-o", b.out}, b.pkgs...)...)
		cmd.Dir = b.dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %v: %v\n%s", b.pkgs, err, out)
		}
	}
	return nil
}

// freePort is a loopback TCP port nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *cluster) startControlPlane() error {
	etcdPort, err := freePort()
	if err != nil {
		return err
	}
	peerPort, err := freePort()
	if err != nil {
		return err
	}
	apiPort, err := freePort()
	if err != nil {
		return err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	c.etcd, err = startProc("etcd", c.logPath("etcd"), nil, filepath.Join(c.kubeBin, "etcd"),
		"--data-dir", filepath.Join(c.dir, "etcd"), "--name", "e2e",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e="+peerURL, "--unsafe-no-fsync", "--log-level", "warn")
	if err != nil {
		return err
	}
	var lines []string
	for _, u := range []string{userAdmin, userController, userGateway, userNode, userAlice, userMallory} {
		c.tokens[u] = randomToken()
		groups := ""
		if u != userAlice && u != userMallory {
			groups = "system:masters"
		}
		lines = append(lines, fmt.Sprintf("%s,%s,uid-%s,%q", c.tokens[u], u, u, groups))
	}
	if err := os.WriteFile(c.pki.path("tokens.csv"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	p := c.pki.path
	// The flags of ../shared/research/k8s-up.sh: no admission webhooks or
	// service-account admission (no controller-manager makes tokens), no
	// priority and fairness (a benchmark measures the server, not its
	// queues).
	c.api, err = startProc("kube-apiserver", c.logPath("kube-apiserver"), nil, filepath.Join(c.kubeBin, "kube-apiserver"),
		"--etcd-servers="+etcdURL, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(apiPort),
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--client-ca-file="+p("ca.crt"), "--token-auth-file="+p("tokens.csv"), "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
		"--disable-admission-plugins=ServiceAccount,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy",
		"--enable-priority-and-fairness=false", "--endpoint-reconciler-type=none", "--cert-dir="+filepath.Join(c.dir, "apiserver-certs"), "--v=1")
	if err != nil {
		return err
	}
	c.apiURL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	c.cfg = c.restConfig(userAdmin)
	if err := c.waitReady(); err != nil {
		return err
	}
	if c.c, err = client.NewWithWatch(c.cfg, client.Options{Scheme: c.scheme}); err != nil {
		return err
	}
	for u := range c.tokens {
		if err := c.writeKubeconfig(u); err != nil {
			return err
		}
	}
	return nil
}

// restConfig is user's client configuration, fast enough for benchmarks.
func (c *cluster) restConfig(user string) *rest.Config {
	return &rest.Config{
		Host:            c.apiURL,
		BearerToken:     c.tokens[user],
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM},
		QPS:             -1, // no client-side rate limit
		Burst:           1000,
	}
}

// kubeconfig is the path of user's kubeconfig file.
func (c *cluster) kubeconfig(user string) string {
	return filepath.Join(c.dir, "kubeconfig-"+user)
}

func (c *cluster) writeKubeconfig(user string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, certificate-authority-data: %s}}]
users: [{name: %s, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: %s}}]
current-context: e2e
`, c.apiURL, base64.StdEncoding.EncodeToString(c.pki.caPEM), user, c.tokens[user], user)
	return os.WriteFile(c.kubeconfig(user), []byte(kc), 0o600)
}

// httpClient trusts the cluster's CA.
func (c *cluster) httpClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caPEM)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 30 * time.Second}
}

// apiGet is a GET on the apiserver as the admin: its body.
func (c *cluster) apiGet(path string) (string, error) {
	req, err := http.NewRequest("GET", c.apiURL+path, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.tokens[userAdmin])
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return string(b), fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return string(b), err
}

// waitReady waits for the apiserver's /readyz (there is no event to wait
// on: a server starting up answers nothing until it answers).
func (c *cluster) waitReady() error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		body, err := c.apiGet("/readyz")
		if err == nil && body == "ok" {
			return nil
		}
		if c.api.exited() {
			return fmt.Errorf("kube-apiserver exited:\n%s", c.api.tail(4000))
		}
		if c.etcd.exited() {
			return fmt.Errorf("etcd exited:\n%s", c.etcd.tail(4000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready: %v %s", err, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// upstreamCRDs is agent-sandbox's CRD directory in its module (never
// copied into this repository).
func upstreamCRDs() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/agent-sandbox").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m sigs.k8s.io/agent-sandbox: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "k8s", "crds")
	if _, err := os.Stat(dir); err != nil {
		return "", err
	}
	return dir, nil
}

// installCRDs installs agent-sandbox's four CRDs and airlock's own
// (k8s/config/crd) and waits until the server serves them.
func (c *cluster) installCRDs() error {
	up, err := upstreamCRDs()
	if err != nil {
		return err
	}
	ours, err := filepath.Abs("../config/crd")
	if err != nil {
		return err
	}
	c.crdPaths = []string{up, ours}
	_, err = envtest.InstallCRDs(c.cfg, envtest.CRDInstallOptions{Paths: c.crdPaths, ErrorIfPathMissing: true, MaxTime: time.Minute})
	return err
}

// setupAccess makes the namespaces the tests share and alice's RBAC: she
// may claim and use sandboxes in namespace a, and nothing anywhere else.
func (c *cluster) setupAccess() error {
	ctx := context.Background()
	for _, ns := range []string{systemNamespace, "a", "b"} {
		if err := c.c.Create(ctx, &corev1.Namespace{ObjectMeta: objMeta("", ns)}); err != nil {
			return err
		}
	}
	role := &rbacv1.Role{ObjectMeta: objMeta("a", "sandbox-user"), Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{sandboxv1beta1.GroupVersion.Group}, Resources: []string{"sandboxes", "sandboxes/exec", "sandboxes/files", "sandboxes/processes", "sandboxes/ports", "sandboxes/audit"}, Verbs: []string{"get", "list", "watch", "create"}},
		{APIGroups: []string{extv1beta1.GroupVersion.Group}, Resources: []string{"sandboxclaims"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
	}}
	if err := c.c.Create(ctx, role); err != nil {
		return err
	}
	return c.c.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: objMeta("a", "alice-sandbox-user"),
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: userAlice}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "sandbox-user"},
	})
}

// stop ends everything the run started, by PID, the nodes' sandboxes
// first, and removes the run's directory.
func (c *cluster) stop() {
	c.gateway.stop()
	c.controller.stop()
	for _, n := range c.nodes {
		n.stop()
	}
	c.api.stop()
	c.etcd.stop()
	for _, n := range c.nodes {
		killScope(scopeOf(n.state))
		gcState(c.bin("airlock"), n.state, n.data)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		fmt.Println("k8s e2e: remove the run's directory:", err)
	}
}

// dumpLogs prints the end of every process's log (a failed run).
func (c *cluster) dumpLogs() {
	ents, _ := os.ReadDir(filepath.Join(c.dir, "logs"))
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(c.dir, "logs", e.Name()))
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		fmt.Printf("----- %s (end)\n%s\n", e.Name(), b)
	}
}
