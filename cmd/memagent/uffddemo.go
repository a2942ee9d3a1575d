package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"rmem/internal/cli"
	"rmem/internal/uffddemo"
)

func newUffdDemoCmd(app *cli.App) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "uffd-demo",
		Short: "Serve every page fault of a child process with userfaultfd and verify every page",
		Long: `uffd-demo starts a child process that allocates --size bytes, registers them
with userfaultfd and hands the uffd to this process, which serves each of the
child's page faults with UFFDIO_COPY from a generated pattern. The child
verifies every page. Prints the number of faults and their p50/p99 latency.
Needs root (or vm.unprivileged_userfaultfd=1).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			size, err := app.Size("size")
			if err != nil {
				return err
			}
			if size == 0 || size > 1<<40 {
				return app.Invalid("size", "must be between 1 byte and 1TiB")
			}
			batch, err := app.Int("batch", 1, 64)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			_, err = uffddemo.Run(ctx, app.Stdout(), uffddemo.Options{Size: int64(size), Batch: batch})
			return err
		},
	}
	cmd.Flags().String("size", "256MiB", "memory the child allocates and verifies")
	cmd.Flags().Int("batch", 1, "pages copied per fault (1 to 64)")
	return cmd
}
