// Command memagent pages applications' memory to the rmem pool: it serves
// their page faults with userfaultfd, fetches pages from memory servers and
// evicts cold ones to keep each program under its local-memory budget.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"rmem/internal/cli"
	"rmem/internal/uffddemo"
)

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "memagent",
		Short: "rmem paging agent",
		Long:  `memagent runs programs with their large allocations paged to the rmem pool.`,
	}
	app := cli.NewApp("memagent", "MEMAGENT", root)
	root.AddCommand(newUffdDemoCmd(app))
	root.AddCommand(newMountCmd(app), newUmountCmd(app), newSwaponCmd(app), newSwapoffCmd(app), newCleanupCmd(app))
	root.AddCommand(newRunCmd(app), newServeCmd(app), newStatsCmd(app), newTopCmd(app))
	return root
}

func main() {
	// The uffd demo re-executes this binary as its child: that child must
	// start before any flag parsing.
	uffddemo.MaybeRunChild()
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "memagent: %v\n", err)
		os.Exit(1)
	}
}
