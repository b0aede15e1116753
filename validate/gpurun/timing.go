package gpurun

import (
	"fmt"
	"time"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/human"
)

// LayerTiming is where one layer's time went in a GPU run, and how it
// compares with only reading and uploading the same bytes.
type LayerTiming struct {
	Layer int `json:"layer"`
	// DstBytes and SrcBytes are the expert bytes read from the checkpoint
	// files and copied to the GPU for this layer: DST's stacked bank (and an
	// unfused shared expert), SRC's experts the tokens selected plus its
	// shared expert (the unfused path; 0 when it did not run).
	DstBytes int64 `json:"dst_bytes"`
	SrcBytes int64 `json:"src_bytes"`
	// DstIOSeconds is the time spent reading and uploading DstBytes; the
	// bank streams in on the copy stream while the previous layer computes,
	// so most of it overlaps earlier work. BankWaitSeconds is how long this
	// layer waited for its bank.
	DstIOSeconds    float64 `json:"dst_io_seconds"`
	BankWaitSeconds float64 `json:"bank_wait_seconds"`
	// SrcIOSeconds is the unfused path's time reading and uploading
	// SrcBytes (it uploads one expert, then computes it).
	SrcIOSeconds float64 `json:"src_io_seconds"`
	// ComputeSeconds is the GPU paths' wall time not spent reading or
	// uploading expert weights: kernels, router weights, x and the results'
	// round trips.
	ComputeSeconds float64 `json:"compute_seconds"`
	// ReferenceSeconds is the CPU reference's time where it ran (alongside
	// the GPU paths, so it adds to WallSeconds only where it is longer).
	ReferenceSeconds float64 `json:"reference_seconds,omitempty"`
	// WallSeconds is the layer's share of the run: from the end of the
	// previous layer (waiting for this layer's bank included) to the end of
	// its checks. The layers' WallSeconds add up to the run.
	WallSeconds float64 `json:"wall_seconds"`
	// IOBaselineSeconds (validate's Options.IOBaseline) is the time to read
	// the same IOBaselineBytes (DstBytes + SrcBytes, the same tensors) from
	// the page cache into the same pinned buffers and copy them to the GPU,
	// one layer at a time, after the run has read them once; Ratio is
	// WallSeconds / IOBaselineSeconds.
	IOBaselineSeconds float64 `json:"io_baseline_seconds,omitempty"`
	IOBaselineBytes   int64   `json:"io_baseline_bytes,omitempty"`
	Ratio             float64 `json:"ratio,omitempty"`

	// Staged is what the layer read, for the baseline to replay.
	Staged []StagedTensor `json:"-"`
}

// IOSeconds is the time spent reading and uploading the layer's bytes.
func (t *LayerTiming) IOSeconds() float64 { return t.DstIOSeconds + t.SrcIOSeconds }

// Line is the compact progress line of a layer's timing.
func (t *LayerTiming) Line() string {
	s := fmt.Sprintf("layer %d: read+upload %s (dst %s in %.2fs, waited %.2fs; src %s in %.2fs), compute %.3fs, wall %.2fs",
		t.Layer, human.Bytes(t.DstBytes+t.SrcBytes), human.Bytes(t.DstBytes), t.DstIOSeconds, t.BankWaitSeconds, human.Bytes(t.SrcBytes), t.SrcIOSeconds, t.ComputeSeconds, t.WallSeconds)
	if t.ReferenceSeconds > 0 {
		s += fmt.Sprintf(", cpu reference %.1fs", t.ReferenceSeconds)
	}
	if t.IOBaselineSeconds > 0 {
		s += fmt.Sprintf("; io baseline %s in %.2fs (%.2f GB/s), ratio %.2f",
			human.Bytes(t.IOBaselineBytes), t.IOBaselineSeconds, gb(t.IOBaselineBytes)/t.IOBaselineSeconds, t.Ratio)
	}
	return s
}

func gb(n int64) float64 { return float64(n) / 1e9 }

// StagedTensor is one tensor a stager read, and how.
type StagedTensor struct {
	T      *checkpoint.Tensor
	Decode bool
}

// StageRecord collects what a stager read and uploaded: the tensors, their
// file bytes, and the wall time spent reading them, queueing their copies
// and waiting for the copies.
type StageRecord struct {
	Staged []StagedTensor
	Bytes  int64
	Busy   time.Duration
}

func (r *StageRecord) add(t *checkpoint.Tensor, decode bool, n int64, start time.Time) {
	r.Staged = append(r.Staged, StagedTensor{t, decode})
	r.Bytes += n
	r.Busy += time.Since(start)
}

// addTimed records tensor t's n bytes, staged in pieces that took d.
func (r *StageRecord) addTimed(t *checkpoint.Tensor, decode bool, n int64, d time.Duration) {
	r.Staged = append(r.Staged, StagedTensor{t, decode})
	r.Bytes += n
	r.Busy += d
}

func (r *StageRecord) addWait(start time.Time) { r.Busy += time.Since(start) }

// Recording runs fn with s's I/O collected into rec.
func Recording(s *Stager, rec *StageRecord, fn func() error) error {
	s.rec = rec
	defer func() { s.rec = nil }()
	return fn()
}

// IOBaseline reads and uploads each timed layer's tensors again through
// the compute stream's stager, into a device ring of two chunks, and fills
// IOBaselineSeconds, IOBaselineBytes and Ratio.
func (g *Runner) IOBaseline(timings []LayerTiming) error {
	ring, err := cuda.Alloc[uint8](g.dev, 2*StageChunkBytes)
	if err != nil {
		return fmt.Errorf("io baseline: %w", err)
	}
	defer ring.Free()
	s := g.Stage
	if err := s.wait(); err != nil {
		return err
	}
	s.ring = 2 * StageChunkBytes
	defer func() { s.ring = 0 }()
	for i := range timings {
		tm := &timings[i]
		if len(tm.Staged) == 0 {
			continue
		}
		var rec StageRecord
		t0 := time.Now()
		err := Recording(s, &rec, func() error {
			for _, st := range tm.Staged {
				if err := s.copyTensor(ring.Ptr(), st.T, st.Decode); err != nil {
					return err
				}
			}
			return s.wait()
		})
		if err != nil {
			return fmt.Errorf("io baseline of layer %d: %w", tm.Layer, err)
		}
		tm.IOBaselineSeconds = time.Since(t0).Seconds()
		tm.IOBaselineBytes = rec.Bytes
		if tm.IOBaselineSeconds > 0 {
			tm.Ratio = tm.WallSeconds / tm.IOBaselineSeconds
		}
	}
	return nil
}
