package convert

import (
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/internal/testkit/handwrap"
)

// TestHandWrappers converts issue 30's second set of wrappers, built by
// hand as transformers 5.17 saves them (handwrap.Wrappers, cktest.InklingMM),
// in every layout and, where the text model has an ungated shared expert,
// fuse-shared, and checks every output byte against the plan: the text
// model's experts stacked, everything else (towers, the talker's own MoE)
// carried byte for byte.
func TestHandWrappers(t *testing.T) {
	for mt, h := range handwrap.Wrappers() {
		t.Run(mt, func(t *testing.T) { checkHFFixture(t, cktest.WriteHand(t, h, 30)) })
	}
	t.Run("inkling_mm_model", func(t *testing.T) {
		checkHFFixture(t, cktest.InklingMM(t, filepath.Join("..", "fixtures", "hf", "inkling-text")))
	})
}
