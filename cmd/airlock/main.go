// Command airlock is one static binary: the CLI, the daemon, and the
// sandbox's own init. The init dispatch comes first, before anything else
// runs, because inside a sandbox nothing of the CLI may.
package main

import (
	"os"

	"github.com/airlock-sandbox/airlock/internal/cli"
	"github.com/airlock-sandbox/airlock/internal/runtime/nsinit"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "init":
			nsinit.Main()
		case "userns-hold":
			nsinit.HoldMain()
		}
	}
	os.Exit(cli.Main(os.Args[1:]))
}
