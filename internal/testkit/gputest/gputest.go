// Package gputest holds what a GPU test needs before it runs: a skip on a
// machine without a CUDA driver or device, and a failure (not a skip) where
// CUDA is there but broken, so a GPU machine never passes by skipping. Only
// tests import it.
package gputest

import (
	"errors"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
)

// Need skips t without a CUDA driver or a device, and fails it when CUDA
// is present but unusable.
func Need(t testing.TB) {
	t.Helper()
	if err := cuda.Available(); errors.Is(err, cuda.ErrNoDriver) || errors.Is(err, cuda.ErrNoDevice) {
		t.Skipf("no GPU: %v", err)
	} else if err != nil {
		t.Fatalf("CUDA: %v", err)
	}
}
