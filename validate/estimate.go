package validate

import (
	"fmt"
	"time"

	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/validate/moelayer"
)

// The rates a run's estimate assumes, each measured, and where. An
// estimate printed before a run reads anything cannot know this machine's
// speed, so it says what it assumed; the progress line's ETA, from the
// rate the run reaches, takes over once it starts.
//
// A CPU run costs the larger of its reads and its cores' work (the pass
// overlaps them). The work is a cost per weight element read (decode,
// the byte proof's comparisons and hashes, the pass's bookkeeping) plus
// the products: each weight times each token its expert takes. Fitted on
// the 2-core AMD EPYC (AVX2, no AVX-512) development VM, warm, user+sys
// CPU seconds of issue 45's CPU rows (BENCHMARKS.md, "The estimate"):
// Kimi-K2-shaped INT4 96 experts 1.3-1.4 (12.7 tokens an expert), DeepSeek-V3
// dims FP8 16 experts 4.2-4.7 (66) and 64 experts 6.7-7.1 (18), gpt-oss-shaped
// MXFP4 4.5-4.8 (6), Mixtral dims bf16 4.1-4.6 (34), each within 30% of the
// model (TestEstimateFitsItsRows). A rate a weight alone, whatever the
// tokens, cannot fit them: a weight costs four times as much at 66 tokens
// an expert as at 6.
const (
	// cpuSecsPerElem is a core's seconds for each weight element of SRC
	// and DST the layer checks read, besides the products: 0.45 ns.
	cpuSecsPerElem = 0.45e-9
	// cpuFlops is the products' rate a core, counting a multiply-add as
	// two: the kernel reaches 45-83 GFLOP/s on its own (BENCHMARKS.md);
	// inside a run, with the reference's float64 sums, about 30.
	cpuFlops = 30e9
	// readRate is the disk: this VM's cold `cat` reads 0.7-2.3 GB/s, a
	// CI runner's disk often less, an NVMe more; assumed 1 GB/s. The byte
	// proof keeps up with it: validate --bytes, a streamed pass of SRC's
	// and DST's bytes, read 0.8 GB in 0.5-0.6 s, 2.1 GB in 0.9-1.3 s and
	// 4.8 GB in 2.5 s cold on the same VM (1.5-2.3 GB/s).
	readRate = 1e9
	// gpuRate is the bytes a second a GPU run reads and uploads: 22.95 GB
	// in 11.5 s per DeepSeek-V3 layer on an H100 host (BENCHMARKS.md).
	gpuRate = 2e9
)

// runSize is what a run's estimate is computed from.
type runSize struct {
	device Device
	jobs   int // experts computed at once (the cores the work spreads on)
	// layerBytes are read by the layer checks (SRC's and DST's), whose
	// expert weights hold elemsPerByte elements a byte (0.5 for bf16, 2
	// for the 4-bit formats); proofBytes by the byte proof alone (the rest
	// of DST, and the SRC bytes that predict it).
	layerBytes, proofBytes int64
	elemsPerByte           float64
	// tokensPerExpert is the tokens each routed expert's weights multiply
	// (T·k/E routed, plus its forced ones).
	tokensPerExpert float64
	// bothSides: SRC's and DST's weights are both read; their paths share
	// a weight's product where its bytes are the same (the usual case), so
	// the products count once for the two sides' elements.
	bothSides bool
}

// estimate is the line validate prints before a run: how long it should
// take, for how many bytes, and what it assumed.
func estimate(r runSize) string {
	jobs := max(r.jobs, 1)
	var secs float64
	var basis string
	switch {
	case r.layerBytes == 0:
		secs = float64(r.proofBytes) / readRate
		basis = fmt.Sprintf("byte proof at an assumed %s/s", human.Bytes(readRate))
	case r.device == DeviceCUDA:
		secs = float64(r.layerBytes)/gpuRate + float64(r.proofBytes)/readRate
		basis = fmt.Sprintf("an assumed %s/s on the GPU", human.Bytes(gpuRate))
	default:
		elems := float64(r.layerBytes) * r.elemsPerByte
		products := elems
		if r.bothSides {
			products /= 2
		}
		work := elems*cpuSecsPerElem + products*r.tokensPerExpert*2/cpuFlops
		secs = max(float64(r.layerBytes)/readRate, work/float64(jobs)) + float64(r.proofBytes)/readRate
		basis = fmt.Sprintf("assumed %s/s read, %.0f GFLOP/s a core, %s", human.Bytes(readRate), cpuFlops/1e9, human.Count(jobs, "core"))
	}
	about := "under a second"
	if d := time.Duration(secs * float64(time.Second)); d >= time.Second {
		about = "about " + human.Duration(d)
	}
	return fmt.Sprintf("validate: estimate: %s for %s (%s)", about, human.Bytes(r.layerBytes+r.proofBytes), basis)
}

// runSize is the run's size for its estimate: layerBytes and proofBytes
// as the plan reads them.
func (s *session) runSize(layerBytes, proofBytes int64) runSize {
	return runSize{device: s.o.Device, jobs: s.o.Workers, layerBytes: layerBytes, proofBytes: proofBytes,
		elemsPerByte: s.elemsPerByte(), tokensPerExpert: s.tokensPerExpert(), bothSides: s.src != nil && s.dst != nil}
}

// tokensPerExpert is the tokens a routed expert takes on average: the
// run's T·k/E, and the forced tokens of the coverage rounds (of the
// sampled experts only, with --sample-experts).
func (s *session) tokensPerExpert() float64 {
	p := s.dstPlanOrSrc()
	if p == nil || p.NumExperts <= 0 {
		return 0
	}
	e := float64(p.NumExperts)
	forced := float64(moelayer.DefaultCoverageRounds)
	if n := s.o.SampleExperts; n > 0 && float64(n) < e {
		forced *= float64(n) / e
	}
	return float64(s.o.Tokens*p.TopK)/e + forced
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
