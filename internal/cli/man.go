package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/version"
)

// manCmd writes the manual pages, one per command, generated from the
// commands themselves (scripts/install.sh installs them).
func manCmd(g *cmdutil.Globals) *cobra.Command {
	return &cobra.Command{
		Use:    "man DIR",
		Short:  "Write airlock's manual pages (section 1, one per command) into DIR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := writeMan(cmd.Root(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(g.Stderr, "airlock: wrote the manual pages to %s\n", args[0])
			return nil
		},
	}
}

// writeMan writes root's pages into dir (made if missing).
func writeMan(root *cobra.Command, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root.DisableAutoGenTag = true
	asMarkdown(root)
	return doc.GenManTree(root, &doc.GenManHeader{Title: "AIRLOCK", Section: "1", Source: "airlock " + version.Version, Manual: "airlock manual"}, dir)
}

// asMarkdown makes the indented lines of c's tree's long help (examples,
// commands to type) code blocks of the Markdown the pages are made from,
// so that they stay lines of their own.
func asMarkdown(c *cobra.Command) {
	lines := strings.Split(c.Long, "\n")
	var b strings.Builder
	prose := false
	for i, l := range lines {
		code := strings.HasPrefix(l, " ")
		if code {
			if prose {
				b.WriteString("\n")
			}
			l = "    " + l
		}
		prose = !code && strings.TrimSpace(l) != ""
		b.WriteString(l)
		if i < len(lines)-1 {
			b.WriteString("\n")
		}
	}
	c.Long = b.String()
	for _, s := range c.Commands() {
		asMarkdown(s)
	}
}
