// Package untrusted holds what the host needs wherever it acts on a value a
// sandbox chose: Quote (and QuoteText, for messages), to show a name to a
// person without handing the sandbox their terminal; TerminalText (and
// TerminalWriter), to show its file contents (a diff) on a terminal the
// same way; and LinkInside, to decide whether a symlink the sandbox made
// may be written into a tree on the host. It imports nothing of airlock,
// so that the CLI, the MCP tools, the service and the workspace reader
// share one definition of each.
package untrusted
