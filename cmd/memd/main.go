// Command memd donates this node's spare RAM to the rmem pool (memory-server
// role), coordinates the pool (coordinator role), and administers it (CLI).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"rmem/internal/cli"
)

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "memd",
		Short: "rmem memory server, pool coordinator and admin CLI",
		Long: `memd turns spare RAM on this node into part of the rmem memory pool.

"memd serve" donates memory and, by default, also coordinates the pool with an
embedded store. The other commands administer a running pool.`,
	}
	app := cli.NewApp("memd", "MEMD", root)
	root.AddCommand(newServeCmd(app))
	root.AddCommand(newStatusCmd(app), newServersCmd(app), newAgentsCmd(app), newSlabsCmd(app), newTopCmd(app))
	root.AddCommand(newDrainCmd(app, true), newDrainCmd(app, false))
	return root
}

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "memd: %v\n", err)
		os.Exit(1)
	}
}
