package validate

import (
	"fmt"
	"time"

	"github.com/moeprep/moeprep/internal/human"
)

// The rates a run's estimate assumes (issue 46), each measured, and where.
// An estimate printed before a run reads anything cannot know this
// machine's speed, so it says what it assumed; the progress line's ETA,
// from the rate the run reaches, takes over once it starts.
const (
	// cpuElemsPerCore is the expert weight elements (SRC's and DST's
	// together) one core gets through a second in the CPU layer checks at
	// the default --tokens, reads included: the cost is per weight,
	// whatever its storage (FP8's decode is in it). Measured on the 2-core
	// AMD EPYC (AVX2) development VM, shared with other work: 2 × 1.21 G
	// weights of a Qwen3-30B-A3B-shaped synth (2 MoE layers, 128 experts,
	// hidden 2048) and its gate-up conversion in 19.6 s at best (bf16; in
	// CPU time 15.2 s, and FP8 14.9 s), so 62 M; assumed 60 M.
	cpuElemsPerCore = 60e6
	// proofRate is the DST bytes a second the byte proof alone compares
	// with SRC (validate --bytes, SHA-256 of every shard): 2.42 GB in
	// 7.1 s at best on the same VM; assumed 300 MB/s.
	proofRate = 300e6
	// gpuRate is the bytes a second a GPU run reads and uploads: 22.95 GB
	// in 11.5 s per DeepSeek-V3 layer on an H100 host (BENCHMARKS.md).
	gpuRate = 2e9
)

// estimate is the line validate prints before a run: how long it should
// take for layerBytes read by the layer checks, whose expert weights hold
// elemsPerByte elements a byte (0.5 for bf16, 2 for 4-bit formats), and
// proofBytes read by the byte proof alone, on device with jobs experts
// computed at once.
func estimate(device Device, jobs int, layerBytes, proofBytes int64, elemsPerByte float64) string {
	jobs = max(jobs, 1)
	var secs float64
	var basis string
	switch {
	case layerBytes == 0:
		secs = float64(proofBytes) / proofRate
		basis = fmt.Sprintf("byte proof at an assumed %s/s", human.Bytes(proofRate))
	case device == DeviceCUDA:
		secs = float64(layerBytes)/gpuRate + float64(proofBytes)/proofRate
		basis = fmt.Sprintf("an assumed %s/s on the GPU", human.Bytes(gpuRate))
	default:
		secs = float64(layerBytes)*elemsPerByte/(cpuElemsPerCore*float64(jobs)) + float64(proofBytes)/proofRate
		basis = fmt.Sprintf("an assumed %.0f M weights/s a core on %s", cpuElemsPerCore/1e6, human.Count(jobs, "core"))
	}
	about := "under a second"
	if d := time.Duration(secs * float64(time.Second)); d >= time.Second {
		about = "about " + human.Duration(d)
	}
	return fmt.Sprintf("validate: estimate: %s for %s (%s)", about, human.Bytes(layerBytes+proofBytes), basis)
}

// elemsPerByte is the weight elements a byte of the experts' stored
// weights holds (bf16 0.5, FP8 1, INT4 and the FP4 formats 2), from SRC's
// plan or else DST's contract; 0.5 when neither says.
func (s *session) elemsPerByte() float64 {
	var elems, bytes int64
	switch {
	case s.srcPlan != nil:
		if f, err := s.srcPlan.Format(); err == nil {
			elems, bytes = f.Packing()
		}
	case s.contract != nil:
		if f, err := s.contract.Format(); err == nil {
			elems, bytes = f.Packing()
		}
	}
	if elems <= 0 || bytes <= 0 {
		return 0.5
	}
	return float64(elems) / float64(bytes)
}
