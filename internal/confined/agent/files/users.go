// Package files is the in-sandbox agent's filesystem side: E2B envd's
// filesystem.Filesystem service (stat, list, make, move, remove, watch)
// and airlock's own file calls (read, write, edit), acting as the sandbox
// user or as root inside, on paths of the sandbox's own view. Who a
// request acts as (Users, User) and how a path is taken (Resolve) are
// shared with the agent's process service, which serves both.
package files

import (
	"encoding/base64"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"
)

// User is who an operation runs as.
type User struct {
	Name     string
	UID, GID uint32
	Home     string
}

// Users are the two users a request may act as: the sandbox user ("user",
// the default) and root inside ("root").
type Users struct {
	UID, GID uint32 // the sandbox user
	Home     string // the sandbox user's home
}

// FromHeader reads the user the way envd does: the user name of HTTP basic
// authorization ("user" or "root"); the sandbox user when absent.
func (us Users) FromHeader(h http.Header) (User, error) {
	name := "user"
	if v, ok := strings.CutPrefix(h.Get("Authorization"), "Basic "); ok {
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return User{}, connect.NewError(connect.CodeInvalidArgument, errors.New("bad authorization header"))
		}
		if n, _, _ := strings.Cut(string(b), ":"); n != "" {
			name = n
		}
	}
	return us.Lookup(name)
}

// Lookup is the user called name ("" is the sandbox user).
func (us Users) Lookup(name string) (User, error) {
	switch name {
	case "", "user":
		return User{"user", us.UID, us.GID, us.Home}, nil
	case "root":
		return User{"root", 0, 0, "/root"}, nil
	}
	return User{}, connect.NewError(connect.CodeInvalidArgument, errors.New("unknown user "+name+` (want "user" or "root")`))
}

// Resolve makes p absolute (relative paths are taken from the user's home)
// and clean. Every path is inside the sandbox's own root: the agent has no
// other view.
func Resolve(u User, p string) (string, error) {
	if p == "" {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("path is empty"))
	}
	if strings.ContainsRune(p, 0) {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("path contains NUL"))
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(u.Home, p)
	}
	return filepath.Clean(p), nil
}

// ConnectError gives a filesystem error its Connect code.
func ConnectError(err error) error {
	var ce *connect.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, fs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTEMPTY), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EXDEV):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return connect.NewError(connect.CodeResourceExhausted, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// chownNew gives what the agent (root inside) created to the user it acts for.
func chownNew(p string, u User) error {
	if u.UID == 0 {
		return nil
	}
	return os.Lchown(p, int(u.UID), int(u.GID))
}
