// Package host holds the commands that run airlock's engine in this
// process, as root on this host: `run` (one sandbox, one command), `serve`
// (the daemon) and the host's upkeep (doctor, gc, image). Each builds its
// world with internal/system (the composition root), as `airlock mcp`
// does through SystemOptions. It imports api, internal/cli/cmdutil,
// internal/system, internal/run, internal/sandboxnet, internal/doctor,
// internal/sandbox, internal/spec and internal/errdefs.
package host

import (
	"context"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/spec"
	"github.com/airlock-sandbox/airlock/internal/system"
)

// Commands are the commands that run the engine on this host; version is
// the daemon's, for serve.
func Commands(g *cmdutil.Globals, version string) []*cobra.Command {
	return []*cobra.Command{runCmd(g), serveCmd(g, version), doctorCmd(g), gcCmd(g), imageCmd(g)}
}

// SystemOptions are what every mode of internal/system takes from the
// global flags.
func SystemOptions(g *cmdutil.Globals, mode system.Mode) (system.Options, error) {
	cacheBytes, err := spec.ParseSize(g.ImageCache)
	if err != nil {
		return system.Options{}, errdefs.Invalid("--image-cache-size: " + err.Error())
	}
	return system.Options{Mode: mode, StateDir: g.StateDir, DataDir: g.DataDir, Log: g.Log, Warn: g.Warn, Runsc: g.Runsc, Init: g.Init,
		DNSUpstream: g.DNSUpstream, SubnetPool: g.Pool, EgressAllowNets: g.AllowNets, ImageCacheBytes: cacheBytes}, nil
}

// hostSystem is the host's wall and lifecycle, for commands that manage
// sandboxes' remains and images.
func hostSystem(ctx context.Context, g *cmdutil.Globals, warn func(string)) (*system.System, error) {
	if os.Geteuid() != 0 {
		return nil, errdefs.Unavailable("root is needed to manage the host's sandboxes and images: run this as root, or with sudo")
	}
	o, err := SystemOptions(g, system.Host)
	if err != nil {
		return nil, err
	}
	o.Warn = warn
	return system.New(ctx, o)
}
