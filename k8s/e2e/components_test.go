package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// The controller's timings in these tests: a node whose daemon is gone is
// lost after nodeLostTimeout; orphans are swept every sweepInterval.
const (
	nodeLostTimeout = "6s"
	sweepInterval   = "2s"
)

// buildK8s compiles the k8s module's commands into the run's bin.
func (c *cluster) buildK8s() error {
	cmd := exec.Command("go", "build", "-o", c.binDir+"/", "./cmd/airlock-controller", "./cmd/airlock-gateway", "./cmd/airlock-node")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build the k8s commands: %v\n%s", err, out)
	}
	return nil
}

// register makes each node's AirlockNode and admin-key Secret, as the
// DaemonSet's airlock-node does on a real node.
func (c *cluster) register(n *node) error {
	out, err := exec.Command(c.bin("airlock-node"), "--once", "--kubeconfig", c.kubeconfig(userNode),
		"--name", n.name, "--endpoint", n.endpoint(), "--admin-key-file", n.adminKeyFile(),
		"--namespace", systemNamespace, "--runtime-classes", "airlock,airlock-gvisor").CombinedOutput()
	if err != nil {
		return fmt.Errorf("airlock-node %s: %v\n%s", n.name, err, out)
	}
	return nil
}

// startController starts airlock-controller with its own identity; extra
// is added to its environment (the fault hook).
func (c *cluster) startController(extra ...string) error {
	var err error
	c.controller, err = startProc("airlock-controller", c.logPath("airlock-controller"), extra, c.bin("airlock-controller"),
		"--kubeconfig", c.kubeconfig(userController),
		"--runtime-classes", "airlock,airlock-gvisor",
		"--node-lost-timeout", nodeLostTimeout, "--sweep-interval", sweepInterval,
		"--metrics-bind-address", "0")
	return err
}

// startGateway starts airlock-gateway on a free loopback port (plain HTTP
// is allowed there only).
func (c *cluster) startGateway() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c.gateway, err = startProc("airlock-gateway", c.logPath("airlock-gateway"), nil, c.bin("airlock-gateway"),
		"--kubeconfig", c.kubeconfig(userGateway), "--listen", addr)
	c.gatewayURL = "http://" + addr
	return err
}

// waitHTTP waits until url answers anything over HTTP (a server starting
// up answers nothing until it answers; there is no event to wait on).
func waitHTTP(p *proc, url string) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited:\n%s", p.name, p.tail(4000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not answer: %v", p.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gatewayUp waits until the gateway answers (a refusal of a request
// without a token is an answer).
func (c *cluster) gatewayUp() error {
	return waitHTTP(c.gateway, c.gatewayURL+"/v1/namespaces/a/sandboxes/none/exec")
}

// restartController stops the controller and starts another; extra is
// added to its environment.
func (c *cluster) restartController(t testing.TB, extra ...string) {
	t.Helper()
	c.controller.stop()
	if err := c.startController(extra...); err != nil {
		t.Fatal(err)
	}
}

// ensureController starts a controller if the last one has exited (a
// test's fault hook or kill), so that what a test made can be deleted.
func (c *cluster) ensureController(t testing.TB) {
	t.Helper()
	if c.controller.exited() {
		if err := c.startController(); err != nil {
			t.Fatal(err)
		}
	}
}
