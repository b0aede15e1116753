package kernels_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
)

// The gate and align tests share one device; without a driver or a GPU
// they skip.
var (
	rtDevOnce sync.Once
	rtDev     *cuda.Device
	rtDevErr  error
)

func rtDevice(t *testing.T) *cuda.Device {
	t.Helper()
	rtDevOnce.Do(func() {
		rtDev, rtDevErr = cuda.Open(0)
		if rtDevErr == nil {
			t.Logf("device: %s", rtDev)
		}
	})
	if errors.Is(rtDevErr, cuda.ErrNoDriver) || errors.Is(rtDevErr, cuda.ErrNoDevice) {
		t.Skipf("no GPU: %v", rtDevErr)
	}
	if rtDevErr != nil {
		t.Fatalf("opening GPU 0: %v", rtDevErr)
	}
	return rtDev
}

func rtUpload[T cuda.Elem](t *testing.T, d *cuda.Device, v []T) *cuda.Buffer[T] {
	t.Helper()
	b, err := cuda.FromHost(d, v)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

func rtDownload[T cuda.Elem](t *testing.T, b *cuda.Buffer[T]) []T {
	t.Helper()
	v, err := b.ToHost(-1)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// rtTimeUs returns the mean device time in microseconds of fn over reps
// back-to-back calls queued in one Do on the legacy default stream (after a
// warm-up call), so host dispatch stays out of the number as far as the
// launches outrun the GPU.
func rtTimeUs(t *testing.T, d *cuda.Device, reps int, fn func(c *cuda.Ctx) error) float64 {
	t.Helper()
	var ms float32
	err := d.Do(func(c *cuda.Ctx) error {
		if err := fn(c); err != nil {
			return err
		}
		start, err := c.NewEvent()
		if err != nil {
			return err
		}
		defer c.DestroyEvent(start)
		end, err := c.NewEvent()
		if err != nil {
			return err
		}
		defer c.DestroyEvent(end)
		if err := c.Record(start, 0); err != nil {
			return err
		}
		for range reps {
			if err := fn(c); err != nil {
				return err
			}
		}
		if err := c.Record(end, 0); err != nil {
			return err
		}
		if err := c.SyncEvent(end); err != nil {
			return err
		}
		ms, err = c.Elapsed(start, end)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return float64(ms) * 1000 / float64(reps)
}
