// Command airlock is the CLI and the daemon. What runs inside a sandbox is
// another, smaller binary installed beside it (cmd/airlock-init).
package main

import (
	"os"

	"github.com/airlock-sandbox/airlock/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
