// Package exitcode is the one place that maps errors to process exit codes:
// 0 success, 1 a check found a problem, 2 bad usage or unreadable/malformed
// input (and any other failure), 130 interrupted (SIGINT), 143 terminated
// (SIGTERM), as shells report a process killed by those signals.
package exitcode

import (
	"context"
	"errors"
	"strings"
)

// Exit codes.
const (
	OK          = 0
	CheckFailed = 1
	BadInput    = 2
	Interrupted = 130
	Terminated  = 143
)

// ErrInterrupted marks a run stopped by SIGINT, ErrTerminated one stopped
// by SIGTERM.
var (
	ErrInterrupted = errors.New("interrupted")
	ErrTerminated  = errors.New("terminated")
)

// checkFailed marks a completed check that found a problem.
type checkFailed struct{ msg string }

func (e *checkFailed) Error() string { return e.msg }

// Check returns an error that maps to exit code 1.
func Check(msg string) error { return &checkFailed{msg} }

// IsCheckFailure reports whether err maps to exit code 1.
func IsCheckFailure(err error) bool {
	var cf *checkFailed
	return errors.As(err, &cf)
}

// Code maps err to its exit code.
func Code(err error) int {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, ErrTerminated):
		return Terminated
	case errors.Is(err, ErrInterrupted), errors.Is(err, context.Canceled):
		return Interrupted
	case IsCheckFailure(err):
		return CheckFailed
	}
	return BadInput
}

// Message renders err as the single stderr line moeprep prints: errors never
// span lines, whatever a wrapped error contains.
func Message(err error) string {
	msg := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", " ")), " ")
	return "moeprep: " + msg
}
