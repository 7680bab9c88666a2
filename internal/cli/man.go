package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
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
	return doc.GenManTree(root, &doc.GenManHeader{Title: "AIRLOCK", Section: "1", Source: "airlock " + Version, Manual: "airlock manual"}, dir)
}
