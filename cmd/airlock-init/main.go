// Command airlock-init is what runs inside a sandbox, and nothing else:
// the container wall's PID 1 (`init`), the gVisor wall's first process
// (`gvisor-init`) and its checkpoint hook (`gvisor-hook`), both serving the
// agent of a long-lived sandbox. It is installed beside airlock, which
// runs it from a sealed copy (internal/wall/initexe finds and checks it)
// and never runs itself in a sandbox. It links nsinit, the agent and
// internal/version only: every page of it a sandbox touches is memory the
// host pays for once per sandbox, and nothing of the command line or the
// daemon has a use there (internal/archtest keeps it so).
package main

import (
	"fmt"
	"net"
	"os"

	"github.com/airlock-sandbox/airlock/internal/confined/agent"
	"github.com/airlock-sandbox/airlock/internal/confined/nsinit"
	"github.com/airlock-sandbox/airlock/internal/version"
)

const usage = "usage: airlock-init init|gvisor-init|gvisor-hook|version (airlock runs it; it is no command of its own)"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "init":
		nsinit.Main(serveAgent)
	case "gvisor-init":
		nsinit.GVisorMain(serveAgent)
	case "gvisor-hook":
		nsinit.HookMain()
	case "version":
		// What airlock checks before it runs this binary: the two must be
		// one build.
		fmt.Println(version.Version)
		os.Exit(0)
	}
	fmt.Fprintln(os.Stderr, usage)
	os.Exit(2)
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
	// No tuning of the runtime here: a lower GC percent, one P and a
	// forced collection, set once running, each made an idle sandbox cost
	// more, not less (the collection and the change of Ps touch memory an
	// agent that has not yet collected never does; BenchmarkServeIdleMemory,
	// 100 sandboxes: PSS 2.54 MiB each untuned, 2.79-2.94 with any one of
	// them). One P from the start is cheaper: the container wall starts
	// init with GOMAXPROCS=1 in its environment.
	return agent.Serve(agent.Options{
		Listener: ln, Launcher: a.Launcher, UID: a.UID, GID: a.GID,
		Home: a.Home, Env: a.Env, Cwd: a.Cwd, Version: version.Version, SignalResize: a.SignalResize,
	})
}
