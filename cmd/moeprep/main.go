// Command moeprep prepares Mixture-of-Experts checkpoints offline for fast
// serving and proves the prepared checkpoint computes the same function.
//
// The commands in this package are thin: they parse flags and call plain
// functions in the library packages. main is the one place that turns errors
// and signals into exit codes (see internal/exitcode).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/moeprep/moeprep/internal/exitcode"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command line and returns its exit code; tests call it
// in-process with their own writers.
func run(args []string, stdout, stderr io.Writer) (code int) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if _, ok := <-sigs; !ok {
			return
		}
		// First signal: cancel, let the running command clean up.
		cancel(exitcode.ErrInterrupted)
		if _, ok := <-sigs; ok {
			// Second signal: the user insists.
			fmt.Fprintln(stderr, "moeprep: interrupted again, exiting now")
			os.Exit(exitcode.Interrupted)
		}
	}()

	// Last line of defence: no input may end in a stack trace. Every parser
	// checks its input; this only turns a bug into one line and exit 2.
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "moeprep: internal error: %v (please report this with the command you ran)\n", r)
			code = exitcode.BadInput
		}
	}()

	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err != nil && context.Cause(ctx) == exitcode.ErrInterrupted {
		err = fmt.Errorf("%w: %v", exitcode.ErrInterrupted, err)
	}
	if err != nil {
		fmt.Fprintln(stderr, exitcode.Message(err))
	}
	return exitcode.Code(err)
}
