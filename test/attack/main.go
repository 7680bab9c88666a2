// Command attack runs one attack from inside a sandbox and reports whether
// it was stopped. It exits 0 and prints "blocked: ..." when the sandbox held,
// and exits 1 printing "VULNERABLE: ..." when the attack worked. The e2e
// tests copy it (built static) into a sandbox's workspace.
package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

var failed bool

func blocked(format string, a ...any) { fmt.Printf("blocked: "+format+"\n", a...) }
func vulnerable(format string, a ...any) {
	failed = true
	fmt.Printf("VULNERABLE: "+format+"\n", a...)
}

// expectErr reports err == nil as a vulnerability.
func expectErr(what string, err error) {
	if err == nil {
		vulnerable("%s succeeded", what)
		return
	}
	blocked("%s: %v", what, err)
}

// cases maps each case's name to its attack (or measurement); ARGS are
// the command line's after the name.
var cases = map[string]func(args []string){
	"read-host":     readHost,
	"write-outside": writeOutside,
	"landlock":      landlock,
	"host-procs":    hostProcs,
	"ptrace":        ptrace,
	"agent":         agent,
	"exe":           exe,
	"fds":           fds,
	"mount":         mount,
	"mknod":         mknod,
	"setuid":        setuid,
	"fetch":         func(args []string) { fetch(args[0], args[1], args[2] == "direct") },
	"post":          post,
	"front":         front,
	"download":      download,
	"getloop":       getloop,
	"tlsloop":       tlsloop,
	"dial":          dial,
	"resolve":       resolve,
	"addrs":         addrs,
	"stat":          stat,
	"whoami":        whoami,
	"raw-socket":    rawSocket,
	"network":       network,
	"userns":        userns,
	"keyctl":        keyctl,
	"primitives":    primitives,
	"tiocsti":       tiocsti,
	"int80":         i386Syscall,
	"caps":          caps,
	"membomb":       membomb,
	"forkbomb":      forkbomb,
	"sleep":         sleep,
	"fill":          fill,
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: attack CASE [ARGS]")
		os.Exit(2)
	}
	attack, ok := cases[os.Args[1]]
	if !ok {
		fmt.Fprintln(os.Stderr, "unknown case", os.Args[1])
		os.Exit(2)
	}
	attack(os.Args[2:])
	if failed {
		os.Exit(1)
	}
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
