// Command airlock is one static binary: the CLI, the daemon, and the
// sandbox's own init. The init dispatch comes first, before anything else
// runs, because inside a sandbox nothing of the CLI may.
package main

import (
	"net"
	"os"
	goruntime "runtime"
	"runtime/debug"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/confined/agent"
	"github.com/airlock-sandbox/airlock/internal/confined/nsinit"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "init":
			nsinit.Main(serveAgent)
		case "gvisor-init":
			nsinit.GVisorMain(serveAgent)
		case "gvisor-hook":
			nsinit.HookMain()
		}
	}
	os.Exit(cli.Main(os.Args[1:]))
}

// serveAgent runs the in-sandbox agent on what init hands over.
func serveAgent(a nsinit.Agent) error {
	ln := a.Net
	if ln == nil {
		var err error
		if ln, err = net.FileListener(a.Listener); err != nil {
			return err
		}
		a.Listener.Close()
	}
	// An idle agent should cost the host little: collect often, and hand
	// back what the start-up (every package's initialisers) left behind.
	debug.SetGCPercent(25)
	// One P: fewer per-P caches and GC workers; the agent's work is I/O.
	goruntime.GOMAXPROCS(1)
	debug.FreeOSMemory()
	return agent.Serve(agent.Options{
		Listener: ln, Launcher: a.Launcher, UID: a.UID, GID: a.GID,
		Home: a.Home, Env: a.Env, Cwd: a.Cwd, Version: cli.Version,
	})
}
