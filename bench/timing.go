package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/moeprep/moeprep/internal/cuda"
)

// timer times device work on one stream with CUDA events. Before each timed
// run it overwrites an L2-sized-many-times buffer, so no run finds its
// inputs or weights in L2 from the run before (the flush sits outside the
// events). While the device works through the flush, the host queues the
// run's launches, so the events see device time, not launch latency.
type timer struct {
	dev    *cuda.Device
	stream cuda.Stream
	flush  *cuda.Buffer[uint32]
	iters  int
	budget time.Duration
}

// flushBytes is the L2 flush buffer: over 4x the 50-60 MB L2 of an H100/H200.
const flushBytes = 256 << 20

// measure warms op up once, times one run to size the sample, then times
// up to t.iters runs (fewer when they would exceed the budget) and returns
// each run's milliseconds. op(i) queues run i on t.stream.
func (t *timer) measure(ctx context.Context, op func(i int) error) ([]float64, error) {
	if err := op(0); err != nil {
		return nil, err
	}
	if err := t.dev.Do(func(c *cuda.Ctx) error { return c.SyncStream(t.stream) }); err != nil {
		return nil, err
	}
	est, err := t.pass(ctx, 1, op)
	if err != nil {
		return nil, err
	}
	n := itersFor(time.Duration(est[0]*float64(time.Millisecond)), t.budget, t.iters)
	return t.pass(ctx, n, op)
}

// pass times n runs, each between its own pair of events after a flush.
func (t *timer) pass(ctx context.Context, n int, op func(i int) error) (ms []float64, err error) {
	start, end := make([]cuda.Event, n), make([]cuda.Event, n)
	defer func() {
		derr := t.dev.Do(func(c *cuda.Ctx) error {
			for i := range n {
				c.DestroyEvent(start[i])
				c.DestroyEvent(end[i])
			}
			return nil
		})
		if err == nil {
			err = derr
		}
	}()
	if err := t.dev.Do(func(c *cuda.Ctx) error {
		for i := range n {
			var e error
			if start[i], e = c.NewEvent(); e != nil {
				return e
			}
			if end[i], e = c.NewEvent(); e != nil {
				return e
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		err := t.dev.Do(func(c *cuda.Ctx) error {
			if e := c.MemsetD32Async(t.flush.Ptr(), uint32(i)*0x9e3779b9+1, t.flush.Len(), t.stream); e != nil {
				return e
			}
			return c.Record(start[i], t.stream)
		})
		if err != nil {
			return nil, err
		}
		if err := op(i); err != nil {
			return nil, err
		}
		if err := t.dev.Do(func(c *cuda.Ctx) error { return c.Record(end[i], t.stream) }); err != nil {
			return nil, err
		}
	}
	ms = make([]float64, n)
	err = t.dev.Do(func(c *cuda.Ctx) error {
		if e := c.SyncEvent(end[n-1]); e != nil {
			return e
		}
		for i := range n {
			v, e := c.Elapsed(start[i], end[i])
			if e != nil {
				return e
			}
			ms[i] = float64(v)
		}
		return nil
	})
	return ms, err
}

// copyBandwidth times device-to-device copies of n bytes (one warm-up, the
// median of reps) and returns bytes read + written per second.
func copyBandwidth(dev *cuda.Device, n int64, reps int) (float64, error) {
	src, err := cuda.Alloc[uint8](dev, int(n))
	if err != nil {
		return 0, fmt.Errorf("bench: copy-bandwidth source: %w", err)
	}
	defer src.Free()
	dst, err := cuda.Alloc[uint8](dev, int(n))
	if err != nil {
		return 0, fmt.Errorf("bench: copy-bandwidth destination: %w", err)
	}
	defer dst.Free()
	if err := src.Fill(0x5a); err != nil {
		return 0, err
	}
	times := make([]float64, 0, reps)
	err = dev.Do(func(c *cuda.Ctx) error {
		copyOnce := func() error { return c.CopyDtoD(dst.Ptr(), src.Ptr(), int(n)) }
		if e := copyOnce(); e != nil {
			return e
		}
		for range reps {
			ms, e := c.Time(0, copyOnce)
			if e != nil {
				return e
			}
			times = append(times, float64(ms))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("bench: copy bandwidth: %w", err)
	}
	return CopyBandwidth(n, Percentile(times, 50)), nil
}
