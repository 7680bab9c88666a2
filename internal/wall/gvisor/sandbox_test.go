package gvisor

import "testing"

// Regression: every command the Sentry could not start ended 127 with
// runsc's words, where the container wall says 126 for a file it cannot
// run and "command not found" for a name not in the PATH.
func TestNotStartedIsTheContainerWallsCode(t *testing.T) {
	for _, c := range []struct {
		said, msg string
		code      int
	}{
		{`running container: starting container: starting root container: starting sandbox: error finding executable "no-such-command" in PATH [/usr/bin /bin]: no such file or directory`, `"no-such-command": command not found`, 127},
		{"debug line\nrunning container: starting container: starting root container: starting sandbox: creating process: failed to load /etc/passwd: permission denied", "", 126},
		{"starting sandbox: creating process: failed to load /etc/x: exec format error", "", 126},
		{"starting sandbox: creating process: failed to load /nonexistent: no such file or directory", "", 127},
		{"starting sandbox: something else", "runsc: starting sandbox: something else", 127},
	} {
		code, msg := notStarted(c.said)
		if code != c.code || (c.msg != "" && msg != c.msg) {
			t.Errorf("%q: %d %q, want %d %q", c.said, code, msg, c.code, c.msg)
		}
	}
}
