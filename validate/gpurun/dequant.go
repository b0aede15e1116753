package gpurun

import (
	"fmt"
	"math"
	"time"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/cpuref"
	"github.com/moeprep/moeprep/weightfmt"
)

// DecodesOnDevice reports whether expert weights of format f reach the GPU
// kernels as bf16 decoded on the device (kernels.DequantFP8Rows): FP8 with
// one scale per output row or one per weight. The bf16 grouped GEMM then
// runs them, so only the bf16 precision compares them (the decode rounds
// each weight to bf16 once).
func DecodesOnDevice(f weightfmt.Format) bool {
	if f == nil {
		return false
	}
	q := f.Quantization()
	return q == weightfmt.QuantFP8Channel || q == weightfmt.QuantFP8Tensor
}

// dequantScratch is a stager's device room for weights decoded on the
// device: one staging chunk of FP8 codes and a weight's scales. Each grows
// to what is asked (codes at most StageChunkBytes) and lives until the
// stager is freed.
type dequantScratch struct {
	codes, scales *cuda.Buffer[uint8]
}

func (d *dequantScratch) free() {
	for _, b := range []**cuda.Buffer[uint8]{&d.codes, &d.scales} {
		if *b != nil {
			(*b).Free()
			*b = nil
		}
	}
}

// ensure makes *b hold at least n bytes. A buffer too small is freed only
// after s's stream has drained, since queued decodes may still read it.
func (s *Stager) ensure(b **cuda.Buffer[uint8], n int) error {
	if *b != nil && (*b).Len() >= n {
		return nil
	}
	if *b != nil {
		if err := s.wait(); err != nil {
			return err
		}
		(*b).Free()
		*b = nil
	}
	buf, err := cuda.Alloc[uint8](s.dev, n)
	if err != nil {
		return fmt.Errorf("dequant scratch: %w", err)
	}
	*b = buf
	return nil
}

// uploadDecoded queues, for each part, its weight (FP8) and its scale
// (dtype sd) and the weight's decode to bf16 on the device.
func (b *Bank) uploadDecoded(s *Stager, src cpuref.TensorSource, parts []bankPart, sd safetensors.DType) error {
	for _, p := range parts {
		m, err := b.decodedWeight(s, src, p.name, p.shape, p.scaleName, p.scaleShape, sd)
		if err != nil {
			return err
		}
		*p.mat = m
	}
	return nil
}

// decodedWeight allocates the bank's bf16 copy of FP8 tensor name (shape
// want) and queues on s's stream: its scale tensor (shape scaleShape,
// dtype sd) into the stager's scale scratch, then, per chunk of whole rows
// of at most StageChunkBytes, the chunk's bytes into the code scratch and
// its decode into the bank. Copies and decodes share one stream, so a
// chunk overwrites the scratch only after the decode before it has read
// it; device memory beyond the bank is one chunk and one scale tensor.
func (b *Bank) decodedWeight(s *Stager, src cpuref.TensorSource, name string, want []int64, scaleName string, scaleShape []int64, sd safetensors.DType) (kernels.Mat, error) {
	t, err := tensorShaped(src, name, want)
	if err != nil {
		return kernels.Mat{}, err
	}
	if t.DType != safetensors.F8E4M3 {
		return kernels.Mat{}, fmt.Errorf("%s: tensor %s is %s, the contract says F8_E4M3", t.File, name, t.DType)
	}
	if b.DType == 0 {
		b.DType = kernels.MatBF16
	} else if b.DType != kernels.MatBF16 {
		return kernels.Mat{}, fmt.Errorf("%s: tensor %s is decoded to bf16, the bank's other weights are %v", t.File, name, b.DType)
	}
	ts, err := tensorShaped(src, scaleName, scaleShape)
	if err != nil {
		return kernels.Mat{}, err
	}
	if ts.DType != sd {
		return kernels.Mat{}, fmt.Errorf("%s: scale %s is %s, want %s", ts.File, scaleName, ts.DType, sd)
	}
	dsd, err := kernels.DequantScaleOf(sd)
	if err != nil {
		return kernels.Mat{}, err
	}
	n, ns := t.NumElements(), ts.NumElements()
	cols := int64(1)
	if len(want) > 0 {
		cols = want[len(want)-1]
	}
	if cols <= 0 || n <= 0 || n > math.MaxInt/2 || cols > StageChunkBytes {
		return kernels.Mat{}, fmt.Errorf("%s: tensor %s of shape %v cannot be decoded on the device", t.File, name, t.Shape)
	}
	rows := n / cols
	if ns <= 0 || rows%ns != 0 || rows/ns > math.MaxInt32 {
		return kernels.Mat{}, fmt.Errorf("%s: tensor %s has %d rows, its scale %s %d entries", t.File, name, rows, scaleName, ns)
	}
	rps := rows / ns
	if s.rec != nil {
		defer s.rec.add(t, false, n, time.Now())
	}
	buf, err := cuda.Alloc[uint8](s.dev, int(2*n))
	if err != nil {
		return kernels.Mat{}, fmt.Errorf("tensor %s: %w", name, err)
	}
	b.bytes = append(b.bytes, buf)
	b.Size += 2 * n
	if err := s.ensure(&s.dq.scales, int(ns)*sd.Size()); err != nil {
		return kernels.Mat{}, err
	}
	if err := s.copyTensor(s.dq.scales.Ptr(), ts, false); err != nil {
		return kernels.Mat{}, err
	}
	chunk := StageChunkBytes / cols
	if err := s.ensure(&s.dq.codes, int(min(rows, chunk)*cols)); err != nil {
		return kernels.Mat{}, err
	}
	for r0 := int64(0); r0 < rows; r0 += chunk {
		nr := min(chunk, rows-r0)
		if err := s.copyElems(s.dq.codes.Ptr(), t, r0*cols, (r0+nr)*cols, false); err != nil {
			return kernels.Mat{}, err
		}
		q := kernels.Mat{DType: kernels.MatFP8, Ptr: s.dq.codes.Ptr(), Len: int(nr * cols)}
		out := kernels.Mat{DType: kernels.MatBF16, Ptr: buf.Ptr().Add(int(2 * r0 * cols)), Len: int(nr * cols)}
		if err := kernels.DequantFP8Rows(s.dev, s.stream, q, int(nr), int(cols), s.dq.scales.Ptr(), int(ns), dsd, int(rps), int(r0), out); err != nil {
			return kernels.Mat{}, fmt.Errorf("tensor %s: %w", name, err)
		}
	}
	return kernels.Mat{DType: kernels.MatBF16, Ptr: buf.Ptr(), Len: int(n)}, nil
}
