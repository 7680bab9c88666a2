// Package errdefs defines airlock's error classes. Callers wrap these with
// fmt.Errorf("...: %w", errdefs.ErrX) and test them with errors.Is; nothing in
// airlock matches error strings. It imports only the standard library.
package errdefs

import "errors"

var (
	// ErrInvalidArgument: the request is malformed or fails validation.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: the named object does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnavailable: the host lacks a control airlock requires (a kernel
	// feature, a cgroup controller). Create fails closed with this class.
	ErrUnavailable = errors.New("unavailable on this host")
	// ErrResourceExhausted: a limit or quota was reached.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrInternal: a bug or an unexpected kernel answer.
	ErrInternal = errors.New("internal error")
	// ErrAlreadyExists: an object of that name exists.
	ErrAlreadyExists = errors.New("already exists")
	// ErrFailedPrecondition: the object's state does not allow this now
	// (a paused sandbox asked to run a command, say).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnauthenticated: no credentials, or unknown ones.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the caller is known but may not do this.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrTooLarge: a body, file or listing over its cap.
	ErrTooLarge = errors.New("too large")
	// ErrTimeout: the operation ran out of time.
	ErrTimeout = errors.New("timeout")
	// ErrSecretDetected: the call carries what looks like a credential
	// and the policy blocks it.
	ErrSecretDetected = errors.New("secret detected")
)

// New wraps msg in class.
func New(class error, msg string) error { return &classed{msg: msg, class: class} }

// Invalid wraps msg as an ErrInvalidArgument.
func Invalid(msg string) error { return &classed{msg: msg, class: ErrInvalidArgument} }

// Unavailable wraps msg as an ErrUnavailable.
func Unavailable(msg string) error { return &classed{msg: msg, class: ErrUnavailable} }

type classed struct {
	msg   string
	class error
}

func (e *classed) Error() string { return e.msg }
func (e *classed) Unwrap() error { return e.class }
