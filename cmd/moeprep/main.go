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
	"strings"
	"syscall"
	"time"

	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/termsafe"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one command line and returns its exit code; tests call it
// in-process with their own writers.
func run(args []string, stdout, stderr io.Writer) (code int) {
	// Names, values and messages from checkpoint files reach both streams:
	// no control character in them may steer the terminal (termsafe).
	safeOut, safeErr := termsafe.NewWriter(stdout), termsafe.NewWriter(stderr)
	defer safeOut.Flush()
	defer safeErr.Flush()
	stdout, stderr = safeOut, safeErr

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		var sig os.Signal
		select {
		case sig = <-sigs:
		case <-finished:
			return
		}
		// First signal: cancel, and let the running command clean up for
		// as long as a person waits for a ^C; work that cannot see the
		// cancellation (a parser in the middle of a file) does not keep the
		// process alive past it. The partial output stays for --resume and
		// the kernel drops the output's lock with the process.
		cause, code := exitcode.ErrInterrupted, exitcode.Interrupted
		if sig == syscall.SIGTERM {
			cause, code = exitcode.ErrTerminated, exitcode.Terminated
		}
		cancel(cause)
		select {
		case <-sigs:
			fmt.Fprintln(stderr, "moeprep: "+cause.Error()+" again, exiting now")
		case <-time.After(interruptGrace):
			fmt.Fprintln(stderr, "moeprep: "+cause.Error())
		case <-finished:
			return
		}
		os.Exit(code)
	}()

	// Last line of defence: no input may end in a stack trace. Every parser
	// checks its input; this only turns a bug into one line and exit 2.
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "moeprep: internal error: %v (please report this with the command you ran)\n", r)
			code = exitcode.BadInput
		}
	}()

	defer startProfiles()()
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if cause := context.Cause(ctx); err != nil && (cause == exitcode.ErrInterrupted || cause == exitcode.ErrTerminated) {
		// Say what stopped it once; the context's own "context canceled"
		// is noise after that.
		msg := strings.TrimSuffix(strings.TrimSuffix(err.Error(), ": "+context.Canceled.Error()), ": "+cause.Error())
		err = fmt.Errorf("%w: %s", cause, msg)
	}
	if err != nil {
		fmt.Fprintln(stderr, termsafe.Escape(exitcode.Message(err)))
	}
	return exitcode.Code(err)
}

// interruptGrace is how long a cancelled command may take to return before
// the process exits anyway: under a second, as a ^C should feel.
const interruptGrace = 800 * time.Millisecond
