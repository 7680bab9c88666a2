package cmdutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Conn are the flags of every command that talks to the daemon.
type Conn struct {
	g       *Globals
	address string
	keyFile string
	// AsJSON is --json, for the commands that have it.
	AsJSON bool
}

// AddConn adds the connection flags (--address, --key-file, and --json
// when jsonFlag) to c.
func AddConn(c *cobra.Command, g *Globals, jsonFlag bool) *Conn {
	k := &Conn{g: g}
	c.Flags().StringVar(&k.address, "address", "", "daemon address: a unix socket path or https://host:port (default $AIRLOCK_ADDRESS, or "+api.DefaultSocket+")")
	c.Flags().StringVar(&k.keyFile, "key-file", "", "file holding the API key (default $AIRLOCK_API_KEY; for admin commands, the daemon's admin key file)")
	if jsonFlag {
		c.Flags().BoolVar(&k.AsJSON, "json", false, "print JSON")
	}
	return k
}

// Client connects with the first key found: --key-file, $AIRLOCK_API_KEY,
// and for admin commands the daemon's admin key file.
func (k *Conn) Client(admin bool) (*client.Client, error) {
	addr := k.address
	if addr == "" {
		addr = os.Getenv("AIRLOCK_ADDRESS")
	}
	key := os.Getenv("AIRLOCK_API_KEY")
	file := k.keyFile
	if file == "" && (admin || key == "") {
		if _, err := os.Stat(k.g.AdminKeyPath()); err == nil && (admin || key == "") {
			file = k.g.AdminKeyPath()
		}
	}
	if file != "" && (k.keyFile != "" || admin || key == "") {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, errdefs.Invalid("API key: " + err.Error())
		}
		key = strings.TrimSpace(string(b))
	}
	return client.New(client.Config{Address: addr, Key: key})
}

// Show prints what a daemon call answered: its error as APIErr does, v as
// JSON under --json, or else as text prints it.
func (k *Conn) Show(v any, err error, text func() error) error {
	if err != nil {
		return APIErr(err)
	}
	if k.AsJSON {
		return PrintJSON(k.g.Stdout, v)
	}
	return text()
}

// dialErr says why the daemon could not be reached, naming the address
// it was looked for at; any other error (a local file's, say) is left as
// it is.
func dialErr(err error) error {
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" {
		return err
	}
	addr := "the daemon's address"
	if oe.Addr != nil {
		addr = oe.Addr.String()
	}
	hint := "start the daemon (sudo airlock serve), or give its address (--address, $AIRLOCK_ADDRESS)"
	switch {
	case errors.Is(err, unix.ENOENT):
		return errdefs.Unavailable(fmt.Sprintf("no daemon socket at %s: %s", addr, hint))
	case errors.Is(err, unix.ECONNREFUSED):
		return errdefs.Unavailable(fmt.Sprintf("nothing accepts connections at %s: %s", addr, hint))
	case errors.Is(err, unix.EACCES):
		return errdefs.New(errdefs.ErrPermissionDenied, fmt.Sprintf("the daemon's socket %s is not yours to open: run this with sudo", addr))
	}
	return errdefs.Unavailable(fmt.Sprintf("cannot reach the daemon at %s: %v", addr, oe.Err))
}

// APIErr turns a daemon error into the CLI's error classes (exit codes).
func APIErr(err error) error {
	var ae *api.Error
	if !errors.As(err, &ae) {
		return dialErr(err)
	}
	class := map[api.Code]error{
		api.CodeInvalidArgument: errdefs.ErrInvalidArgument, api.CodeNotFound: errdefs.ErrNotFound,
		api.CodeQuotaExceeded: errdefs.ErrResourceExhausted, api.CodeUnavailable: errdefs.ErrUnavailable,
	}[ae.Code]
	if class == nil {
		return errors.New(ae.Message + " (" + string(ae.Code) + ")")
	}
	return errdefs.New(class, ae.Message)
}
