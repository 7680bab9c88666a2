//go:build tools

// Package runsc pins the gVisor runtime (runsc) airlock's gvisor wall runs.
// scripts/runsc.sh builds gvisor.dev/gvisor/runsc from this module; it is a
// module of its own so that the main module's go build, vet and test never
// build gVisor.
package runsc

import _ "gvisor.dev/gvisor/runsc"
