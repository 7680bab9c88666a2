package cmdutil

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The exit codes of every airlock command: the table of README.md's
// "Exit status". A command that runs a command in a sandbox (run, exec,
// attach: see Relays) exits with that command's status, so its own
// failures are all ExitAirlock, never a code the command could have
// answered; every other command exits ExitFailure or ExitUsage.
const (
	ExitOK      = 0
	ExitFailure = 1 // the command failed (not found, refused, unreachable)
	ExitUsage   = 2 // a bad flag, argument or value
	ExitTimeout = 124
	// ExitAirlock is what run, exec and attach exit with when airlock
	// could not do its part: create the sandbox, reach it, start the
	// command, or parse its own flags.
	ExitAirlock  = 125
	ExitNoExec   = 126 // the command is not executable
	ExitNotFound = 127 // the command was not found in the sandbox
	ExitKilled   = 137 // SIGKILL: the memory limit, or a kill
)

// relaysExit is the annotation of a command that relays a sandboxed
// command's exit status.
const relaysExit = "airlock.relays-exit"

// Relays marks c as a command whose exit status is a sandboxed command's
// (run, exec, attach), and returns it.
func Relays(c *cobra.Command) *cobra.Command {
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[relaysExit] = "true"
	return c
}

// ExitCode is the exit status of a command c that returned err: the one
// mapping every command's errors go through.
func ExitCode(c *cobra.Command, err error) int {
	var ee ExitError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ee):
		return ee.Code
	case c != nil && c.Annotations[relaysExit] == "true":
		return ExitAirlock
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return ExitUsage
	}
	return ExitFailure
}

// Usage makes every argument check of c's tree answer a usage error
// (ExitUsage), and a command that only groups others refuse a
// subcommand it does not have, as the root refuses one.
func Usage(c *cobra.Command) {
	switch {
	case c.Args != nil:
		check := c.Args
		c.Args = func(c *cobra.Command, args []string) error {
			err := check(c, args)
			if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				return errdefs.Invalid(err.Error())
			}
			return err
		}
	case c.HasSubCommands() && !c.Runnable():
		c.Args = func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := "unknown command \"" + args[0] + "\" for \"" + c.CommandPath() + "\""
			if s := c.SuggestionsFor(args[0]); len(s) > 0 {
				msg += ": did you mean " + s[0] + "?"
			}
			return errdefs.Invalid(msg + " (see " + c.CommandPath() + " --help)")
		}
		c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	}
	for _, sub := range c.Commands() {
		Usage(sub)
	}
}
