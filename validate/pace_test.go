package validate

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// layerPace lets a step go once every reader that reads it is done, in
// any order, holds a reader that runs more than window steps ahead of the
// first step not yet gone, and lets it go on once that step goes or its
// context ends; finish stands for every step a reader left.
func TestLayerPace(t *testing.T) {
	// Bank experts 0..3 routed, 4..5 shared replicas read first.
	order := []int{4, 5, 0, 1, 2, 3}
	all := [numReaders]bool{true, true, true}
	cases := []struct {
		name    string
		readers [numReaders]bool
		dones   [][2]int // reader, bank expert
		want    []int    // released, in order
	}{
		{"replicas need the bank alone", all, [][2]int{{readerBank, 4}, {readerBank, 5}}, []int{4, 5}},
		{"routed need every reader", all, [][2]int{{readerBank, 0}, {readerUnfused, 0}}, nil},
		{"last reader releases", all, [][2]int{{readerBank, 0}, {readerUnfused, 0}, {readerRef, 0}}, []int{0}},
		{"twice counts once", all, [][2]int{{readerBank, 1}, {readerBank, 1}, {readerUnfused, 1}}, nil},
		{"no reference", [numReaders]bool{true, true, false}, [][2]int{{readerUnfused, 2}, {readerBank, 2}}, []int{2}},
		{"unread steps go at once", [numReaders]bool{false, true, true}, nil, []int{4, 5}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []int
			p := newLayerPace(order, 4, c.readers, 2, func(b int) { got = append(got, b) }, nil)
			for _, d := range c.dones {
				p.reader(d[0]).Done(d[1])
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("released %v, want %v", got, c.want)
			}
		})
	}

	t.Run("window holds the fast reader", func(t *testing.T) {
		var mu sync.Mutex
		var got []int
		p := newLayerPace(order, 4, [numReaders]bool{true, true, false}, 2, func(b int) { mu.Lock(); got = append(got, b); mu.Unlock() }, nil)
		bank := p.reader(readerBank)
		for _, b := range []int{4, 5, 0, 1} { // replicas go; 0 and 1 wait for the unfused path
			if err := bank.Take(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			bank.Done(b)
		}
		took := make(chan error, 1)
		go func() { took <- bank.Take(context.Background(), 2) }() // position 4: low 2 + window 2
		select {
		case err := <-took:
			t.Fatalf("took expert 2 with experts 0 and 1 held (err %v)", err)
		case <-time.After(50 * time.Millisecond):
		}
		p.reader(readerUnfused).Done(0)
		if err := <-took; err != nil {
			t.Fatal(err)
		}
		p.finish(readerUnfused)
		mu.Lock()
		defer mu.Unlock()
		if want := []int{4, 5, 0, 1}; !slices.Equal(got, want) {
			t.Errorf("released %v, want %v", got, want)
		}
	})

	t.Run("the byte proof holds the fast reader", func(t *testing.T) {
		// The pass's steps are the positions in order. Only the bank
		// reads, so the readers' window never holds it: the proof's does.
		var wanted []int
		mark := newProofMark(func(i int) { wanted = append(wanted, i) })
		step := func(b int) int { return slices.Index(order, b) }
		p := newLayerPace(order, 4, [numReaders]bool{true, false, false}, 2, func(int) {}, func(ctx context.Context, b int) error { return mark.wait(ctx, step(b)) })
		bank := p.reader(readerBank)
		for _, b := range []int{4, 5} { // positions 0 and 1: within the window of nothing taken
			if err := bank.Take(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			bank.Done(b)
		}
		took := make(chan error, 1)
		go func() { took <- bank.Take(context.Background(), 0) }() // position 2: needs position 0 (expert 4) taken
		select {
		case err := <-took:
			t.Fatalf("took expert 0 before the proof took expert 4's step (err %v)", err)
		case <-time.After(50 * time.Millisecond):
		}
		mark.taken(0)
		if err := <-took; err != nil {
			t.Fatal(err)
		}
		// While it waited, the reader asked the pass for the step the
		// proof takes next.
		if len(wanted) == 0 || wanted[0] != 0 {
			t.Fatalf("a reader waiting on the proof asked for steps %v, want step 0 first", wanted)
		}
		bank.Done(0)
		// A proof that ended holds no one.
		go func() { took <- bank.Take(context.Background(), 2) }() // position 4: needs position 2 (expert 0)
		mark.taken(1)
		select {
		case err := <-took:
			t.Fatalf("took expert 2 before the proof took expert 0's step (err %v)", err)
		case <-time.After(50 * time.Millisecond):
		}
		mark.end()
		if err := <-took; err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := newProofMark(nil).wait(ctx, 0); err == nil {
			t.Fatal("a wait on the proof returned nil after its context ended")
		}
	})

	t.Run("context ends a wait", func(t *testing.T) {
		p := newLayerPace(order, 4, all, 1, func(int) {}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		took := make(chan error, 1)
		go func() { took <- p.reader(readerRef).Take(ctx, 3) }()
		time.Sleep(20 * time.Millisecond)
		cancel()
		if err := <-took; err == nil {
			t.Fatal("Take returned nil after its context ended")
		}
		if err := p.reader(readerRef).Take(context.Background(), 99); err == nil {
			t.Fatal("Take of an expert outside the layer returned nil")
		}
	})

	// A layer whose GPU path failed cancels its context: a reader within
	// the window (which would not wait) is refused too, so the reference
	// and the bank's upload stop at their next expert instead of reading
	// the layer out.
	t.Run("ended context refuses within the window", func(t *testing.T) {
		p := newLayerPace(order, 4, all, len(order), func(int) {}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		if err := p.reader(readerRef).Take(ctx, 0); err != nil {
			t.Fatalf("Take within the window: %v", err)
		}
		cancel()
		for _, b := range []int{0, 1, 4} {
			if err := p.reader(readerRef).Take(ctx, b); err != context.Canceled {
				t.Errorf("Take of expert %d after cancel: %v, want %v", b, err, context.Canceled)
			}
		}
	})
}
