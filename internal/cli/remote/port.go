package remote

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func portCmd(g *cmdutil.Globals) *cobra.Command {
	var ttl string
	c := &cobra.Command{
		Use:   "port SANDBOX PORT",
		Short: "Print the URL and a token that reach a server listening on PORT inside a sandbox",
		Long: `port mints a token that reaches one TCP port of one sandbox through the
daemon's front (/v1/sandboxes/ID/ports/PORT/...), HTTP and WebSocket,
without the API key, until it expires (--ttl, default 1h, at most 168h);
and prints the URL of the port's root with the token in it, then the
token. The URL reaches that one address: a page's own links need the
token too (the X-Airlock-Port-Token header, or the airlock_token query
parameter), since every sandbox's ports share the daemon's origin and the
daemon keeps no token in a cookie there; for a whole web app in a browser
use airlock port-forward. Every connection is recorded (port.connect).

The server must listen on 127.0.0.1 (or every address) inside the
sandbox; nothing listens on the host, and the sandbox gains no way out.
Over the daemon's unix socket the URL is a path: the daemon must serve
--tcp for a browser to use it; or use airlock port-forward.

  airlock exec --background "$id" -- python3 -m http.server 8000
  airlock port "$id" 8000`,
		Args: cobra.ExactArgs(2),
	}
	c.Flags().StringVar(&ttl, "ttl", "", "how long the token works (a Go duration; default 1h)")
	return onDaemon(g, c, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		port, err := portArg(args[1])
		if err != nil {
			return err
		}
		tok, err := cl.MintPortToken(ctx, args[0], port, ttl)
		return k.Show(tok, err, func() error {
			fmt.Fprintln(g.Stdout, tok.URL)
			fmt.Fprintln(g.Stdout, tok.Token)
			if strings.HasPrefix(tok.URL, "/") {
				g.Warn("the daemon was reached over its unix socket, so the URL is a path: a browser needs the daemon's --tcp address before it; or use airlock port-forward")
			}
			g.Warn("the token works until " + tok.Expires.Format(time.RFC3339))
			return nil
		})
	})
}

func portForwardCmd(g *cmdutil.Globals) *cobra.Command {
	var bind string
	c := &cobra.Command{
		Use:   "port-forward SANDBOX [LOCAL:]PORT",
		Short: "Forward a local port to a port inside a sandbox, through the daemon",
		Long: `port-forward listens on LOCAL (on 127.0.0.1, or --bind) and tunnels each
connection through the daemon to 127.0.0.1:PORT inside the sandbox, until
Ctrl-C; like kubectl port-forward. LOCAL defaults to PORT; 0 picks a free
port. It prints the address it listens on. Every connection is recorded
(port.connect). Any TCP protocol works; a half-close is not passed on.

  airlock port-forward "$id" 8080:3000 &
  curl http://127.0.0.1:8080/`,
		Args: cobra.ExactArgs(2),
	}
	c.Flags().StringVar(&bind, "bind", "127.0.0.1", "the local address to listen on")
	return onDaemon(g, c, false, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		id := args[0]
		local, remote, ok := strings.Cut(args[1], ":")
		if !ok {
			remote = local
		}
		port, err := portArg(remote)
		if err != nil {
			return err
		}
		if _, err := strconv.ParseUint(local, 10, 16); err != nil {
			return errdefs.Invalid(fmt.Sprintf("local port %q: want 0-65535", local))
		}
		// The sandbox is checked before anything listens.
		if _, err := cl.Sandbox(ctx, id); err != nil {
			return cmdutil.APIErr(err)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(bind, local))
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(ctx, unix.SIGINT, unix.SIGTERM)
		defer stop()
		go func() {
			<-ctx.Done()
			ln.Close()
		}()
		fmt.Fprintf(g.Stdout, "Forwarding from %s -> %d\n", ln.Addr(), port)
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			lc, err := ln.Accept()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			wg.Go(func() { forward(ctx, g, cl, lc, id, port) })
		}
	})
}

// forward tunnels local connection lc to port of sandbox id until the
// sandbox's side ends, or ctx does.
func forward(ctx context.Context, g *cmdutil.Globals, cl *client.Client, lc net.Conn, id string, port int) {
	defer lc.Close()
	rc, err := cl.DialPort(ctx, id, port)
	if err != nil {
		g.Warn(fmt.Sprintf("a connection to port %d: %v", port, cmdutil.APIErr(err)))
		return
	}
	defer rc.Close()
	stop := context.AfterFunc(ctx, func() { rc.Close(); lc.Close() })
	defer stop()
	go func() { _, _ = io.Copy(rc, lc) }()
	_, _ = io.Copy(lc, rc)
}

// portArg is a port inside a sandbox.
func portArg(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, errdefs.Invalid(fmt.Sprintf("port %q: want 1-65535", s))
	}
	return p, nil
}
