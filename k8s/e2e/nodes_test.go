package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	airlock "github.com/airlock-sandbox/airlock/client"
)

// nodeCPUs is every node's --capacity-cpus.
const nodeCPUs = 2

// node is one `airlock serve` daemon: a cluster node. Its state, data,
// socket and subnet pool are its own: the pools are 10.239.N.0/24, apart
// from each other and from the 10.234.0.0/16 default the main e2e suite's
// daemons take theirs from.
type node struct {
	c     *cluster
	name  string
	state string
	data  string
	sock  string
	pool  string
	p     *proc
	admin *airlock.Client
}

func (c *cluster) startNodes() error {
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("n%d", i)
		dir := filepath.Join(c.dir, name)
		n := &node{c: c, name: name, state: filepath.Join(dir, "state"), data: filepath.Join(dir, "data"),
			sock: filepath.Join(dir, "airlock.sock"), pool: fmt.Sprintf("10.239.%d.0/24", i)}
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return err
		}
		c.nodes = append(c.nodes, n)
		if err := n.start(); err != nil {
			return err
		}
	}
	return nil
}

// start starts the daemon on the node's own state (also after a kill: it
// adopts what it left) and waits until it answers.
func (n *node) start() error {
	var err error
	n.p, err = startProc(n.name, n.c.logPath(n.name), nil, n.c.bin("airlock"),
		"--state-dir", n.state, "--data-dir", n.data, "serve", "--socket", n.sock,
		"--subnet-pool", n.pool, "--capacity-cpus", fmt.Sprint(nodeCPUs), "--node-name", n.name)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if conn, err := net.Dial("unix", n.sock); err == nil {
			conn.Close()
			break
		}
		if n.p.exited() {
			return fmt.Errorf("daemon %s exited:\n%s", n.name, n.p.tail(4000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon %s did not start:\n%s", n.name, n.p.tail(4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	key, err := os.ReadFile(n.adminKeyFile())
	if err != nil {
		return err
	}
	if n.admin, err = airlock.New(airlock.Config{Address: n.sock, Key: strings.TrimSpace(string(key))}); err != nil {
		return err
	}
	return n.admin.Health(context.Background())
}

func (n *node) adminKeyFile() string { return filepath.Join(n.data, "admin.key") }

// endpoint is the node's address as its AirlockNode names it.
func (n *node) endpoint() string { return "unix://" + n.sock }

// stop ends the daemon's sandboxes and then the daemon.
func (n *node) stop() {
	if n.p == nil || n.p.exited() {
		return
	}
	if n.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if _, err := n.admin.KillAll(ctx, ""); err != nil {
			fmt.Printf("k8s e2e: kill-all on %s: %v\n", n.name, err)
		}
		cancel()
	}
	n.p.stop()
}
