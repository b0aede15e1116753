package gpurun

import (
	"slices"
	"testing"
)

// freeLog records the order in which fake device buffers are freed.
type freeLog struct{ order []string }

type fakeBuffer struct {
	name string
	log  *freeLog
}

func (b fakeBuffer) Free() error { b.log.order = append(b.log.order, b.name); return nil }

// TestFreesDeferred: a Frees released by a defer placed before anything is
// added to it frees everything added after, once, after the sync, and is
// left empty. With Release on a value receiver the deferred call saw the
// empty list of the defer and freed nothing (every GPU run kept all its
// device buffers: issue 44's Kimi K3 ran out of device memory).
func TestFreesDeferred(t *testing.T) {
	for _, n := range []int{0, 1, 3, 896} {
		var log freeLog
		var fr Frees
		func() {
			defer fr.release(func() error { log.order = append(log.order, "sync"); return nil })
			for i := range n {
				fr.add(fakeBuffer{name: string(rune('a' + i%26)), log: &log})
			}
		}()
		want := []string{"sync"}
		for i := range n {
			want = append(want, string(rune('a'+i%26)))
		}
		if !slices.Equal(log.order, want) {
			t.Errorf("%d buffers: freed %d of them (log %d long), want sync then all %d", n, max(0, len(log.order)-1), len(log.order), n)
		}
		if len(fr) != 0 {
			t.Errorf("%d buffers: %d left in the list after release, want 0", n, len(fr))
		}
		fr.release(func() error { return nil }) // again: nothing more is freed
		if len(log.order) != len(want) {
			t.Errorf("%d buffers: a second release freed %d more", n, len(log.order)-len(want))
		}
	}
}
