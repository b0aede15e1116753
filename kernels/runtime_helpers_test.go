package kernels_test

import (
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
)

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
		var err error
		ms, err = c.Time(0, func() error {
			for range reps {
				if err := fn(c); err != nil {
					return err
				}
			}
			return nil
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return float64(ms) * 1000 / float64(reps)
}
