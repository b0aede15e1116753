package moelayer

import (
	"context"

	"github.com/moeprep/moeprep/moe"
)

// RefResult is the unfused reference's output for one layer.
type RefResult struct {
	Y       []float32 // [T,H]
	Routing *moe.Routing
	// YRequant is Y with the shared expert quantised as
	// RefOptions.RequantShared says and dequantised exactly; nil without.
	// RequantWeightErr is how far that moved the shared expert's weights:
	// sqrt of the sum over gate, up and down of (||Wq - W|| / ||W||)^2;
	// SharedShare is ||shared(x)|| / ||Y|| over the routed tokens.
	YRequant         []float32
	RequantWeightErr float64
	SharedShare      float64
}

// Pace paces a layer's reads of its experts' weights in a streamed run,
// where other readers of the same bytes go at their own speed and memory
// holds only the bytes between the slowest and the fastest: Take before
// expert id's weights are read (it may wait for the slower readers of
// earlier experts), Done once they are no longer needed (also for an
// expert never read). Every expert gets one Done.
type Pace interface {
	Take(ctx context.Context, expert int) error
	Done(expert int)
}
