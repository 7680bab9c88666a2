// Package version is airlock's version, one variable set at build time for
// both binaries, airlock and airlock-init (cmd/airlock-init), so that the
// one can check it runs the other's build. It imports nothing.
package version

// Version is set at build time with
// -ldflags "-X github.com/airlock-sandbox/airlock/internal/version.Version=...".
var Version = "dev"
