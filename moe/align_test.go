package moe

import (
	"slices"
	"testing"
)

// TestAlignBlocks: Block gives a block's slots without the padding, and
// MaxPaddedTokens the worst case; 3 tokens x 2 slots over 4 experts, block
// 2 (moetest.TestAlign checks the arrays themselves).
func TestAlignBlocks(t *testing.T) {
	a, err := AlignBlockSize([]int32{2, 0, 2, 1, 0, 2}, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	for b, want := range [][]int32{{1, 4}, {3}, {0, 2}, {5}} {
		if got := a.Block(b); !slices.Equal(got, want) {
			t.Errorf("block %d = %v, want %v", b, got, want)
		}
	}
	if a.Blocks() != 4 {
		t.Errorf("%d blocks, want 4", a.Blocks())
	}
	if got := MaxPaddedTokens(6, 4, 2); got != 10 {
		t.Errorf("MaxPaddedTokens = %d, want 10", got)
	}
	if _, err := AlignBlockSize(make([]int32, 10), 1<<30, 4); err == nil {
		t.Error("a worst case past int32 accepted")
	}
}
