package gpurun

import (
	"testing"
	"time"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/cuda"
)

// TestStagerRing: with a ring, chunk offsets wrap into the ring and a chunk
// that would cross its end starts at 0; without one they pass through.
func TestStagerRing(t *testing.T) {
	const base = cuda.DevicePtr(1 << 40)
	c := int64(StageChunkBytes)
	tests := []struct {
		ring, out, n int64
		want         cuda.DevicePtr
	}{
		{0, 5 * c, c, base.Add(int(5 * c))},
		{2 * c, 0, c, base},
		{2 * c, c, c, base.Add(int(c))},
		{2 * c, 2 * c, c, base},
		{2 * c, 7 * c, 100, base.Add(int(c))},
		{2 * c, c + 8, c, base}, // would cross the end
		{2 * c, 3*c + 8, 16, base.Add(int(c + 8))},
	}
	for _, tt := range tests {
		s := &Stager{ring: tt.ring}
		if got := s.at(base, tt.out, tt.n); got != tt.want {
			t.Errorf("ring %d out %d n %d: %#x, want %#x", tt.ring, tt.out, tt.n, got, tt.want)
		}
	}
}

// TestStageRecord: a record counts each tensor's bytes once, keeps the
// tensors in order for the replay, and adds up the time.
func TestStageRecord(t *testing.T) {
	var r StageRecord
	a, b := &checkpoint.Tensor{Name: "a"}, &checkpoint.Tensor{Name: "b"}
	r.add(a, false, 100, timeAgo(2e6))
	r.add(b, true, 28, timeAgo(1e6))
	r.addWait(timeAgo(1e6))
	if r.Bytes != 128 || len(r.Staged) != 2 || r.Staged[0].T != a || r.Staged[1].T != b || !r.Staged[1].Decode || r.Staged[0].Decode {
		t.Errorf("record %+v", r)
	}
	if r.Busy.Nanoseconds() < 4e6 {
		t.Errorf("busy %v, want >= 4ms", r.Busy)
	}
}

func timeAgo(ns float64) time.Time { return time.Now().Add(-time.Duration(ns)) }
