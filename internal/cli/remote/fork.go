package remote

import (
	"context"
	"fmt"

	"github.com/airlock-sandbox/airlock/api"
	"github.com/airlock-sandbox/airlock/client"
	"github.com/airlock-sandbox/airlock/internal/cli/cmdutil"
	"github.com/airlock-sandbox/airlock/internal/progress"
	"github.com/spf13/cobra"
)

func forkCmd(g *cmdutil.Globals) *cobra.Command {
	var count int
	c := &cobra.Command{Use: "fork SANDBOX", Short: "Make copies of a running sandbox and print their ids", Args: cobra.ExactArgs(1),
		Long: fmt.Sprintf(`Make --count new sandboxes (1 to %d) from one checkpoint of a running
sandbox, and print their ids, one a line (--json: the whole answer, the
new sandboxes in "sandboxes"). The sandbox runs on.

On the gvisor wall each copy continues from the sandbox's memory and files
as they were at the checkpoint: its processes run on, /tmp and /workspace
as they were. A gvisor sandbox in proxy mode cannot be forked. On the
container wall a fork copies files only (its root changes and /workspace):
every copy starts afresh on them, and a line on stderr says so ("memory":
false in --json).

Each copy is a sandbox of its own (its id, limits, agent, and on the
container wall its network namespace and grants), with the source's spec,
expiry and idle timeout, counted against your quotas: a fork that would
pass them is refused, and one whose copies cannot all be made makes none.
Calls in flight on a gvisor source while it is checkpointed (a streamed
exec's output, an attach, a watch) are cut; its commands run on.`, api.MaxForks)}
	onDaemon(g, c, true, func(ctx context.Context, cl *client.Client, k *cmdutil.Conn, args []string) error {
		f, err := cl.Fork(ctx, args[0], count)
		if err == nil {
			if f.Memory {
				g.Warn(fmt.Sprintf("fork: %d copies of %s with its memory (%s MiB, checkpointed in %d ms)", len(f.Sandboxes), args[0], progress.MiB(f.MemoryBytes), f.CheckpointMillis))
			} else {
				g.Warn(fmt.Sprintf("fork: %s is on the container wall: its %d copies have its files only, not its memory (their processes start afresh)", args[0], len(f.Sandboxes)))
			}
		}
		return k.Show(f, err, func() error {
			for _, sb := range f.Sandboxes {
				fmt.Fprintln(g.Stdout, sb.ID)
			}
			return nil
		})
	})
	c.Flags().IntVarP(&count, "count", "n", 1, fmt.Sprintf("how many copies (1 to %d)", api.MaxForks))
	return c
}
