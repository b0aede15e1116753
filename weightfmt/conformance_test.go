package weightfmt_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
	"github.com/moeprep/moeprep/weightfmt/weightfmttest"
)

// referenceDecoder is the formats' own decode: DequantiseWeight, the
// exact float32 dequantisation everything else is measured against.
type referenceDecoder struct{}

func (referenceDecoder) Output() safetensors.DType { return safetensors.F32 }

func (referenceDecoder) Decode(w weightfmttest.Weight) ([]float32, error) {
	dst := make([]float32, w.Rows*w.Cols)
	err := weightfmt.DequantiseWeight(w.Format, w.Raw, w.Rows, w.Cols, w.Scale, w.Global, dst)
	return dst, err
}

// dequantiserDecoder is convert --dtype's path: Dequantiser.DequantRows
// into to, fast (the FP8 formats' table of encoded values) or Reference,
// in two pieces split on a scale block of rows, so that the pieces' byte
// offsets into the weight and its scale grid are checked too.
type dequantiserDecoder struct {
	to        safetensors.DType
	reference bool
}

func (d dequantiserDecoder) Output() safetensors.DType { return d.to }

func (d dequantiserDecoder) Decode(w weightfmttest.Weight) ([]float32, error) {
	m := weightfmt.Matrix{Format: w.Format, Rows: int64(w.Rows), Cols: int64(w.Cols)}
	es := d.to.Size()
	out := make([]byte, w.Rows*w.Cols*es)
	deq := weightfmt.Dequantiser{Reference: d.reference}
	src := weightfmt.MemRows{Raw: w.Raw, Scale: w.Scale, Global: w.Global}
	split := int64(w.Rows) / 2 / m.RowUnit() * m.RowUnit()
	for _, p := range [][2]int64{{0, split}, {split, int64(w.Rows) - split}} {
		o := out[p[0]*int64(w.Cols*es) : (p[0]+p[1])*int64(w.Cols*es)]
		if err := deq.DequantRows(m, src, p[0], p[1], d.to, o); err != nil {
			var ov *weightfmt.OverflowError
			if !errors.As(err, &ov) {
				return nil, fmt.Errorf("not an overflow: %w", err)
			}
			return nil, err
		}
	}
	got := make([]float32, w.Rows*w.Cols)
	for i := range got {
		switch d.to {
		case safetensors.F32:
			got[i] = math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))
		case safetensors.BF16:
			got[i] = numfmt.BF16ToF32(binary.LittleEndian.Uint16(out[2*i:]))
		default:
			got[i] = numfmt.F16ToF32(binary.LittleEndian.Uint16(out[2*i:]))
		}
	}
	return got, nil
}

// TestDecodeConformance runs the weight-decode conformance suite against
// the formats' reference decode and the Dequantiser, fast and reference,
// into each dtype it writes.
func TestDecodeConformance(t *testing.T) {
	t.Run("reference", func(t *testing.T) { weightfmttest.TestAll(t, referenceDecoder{}) })
	for _, to := range []safetensors.DType{safetensors.F32, safetensors.BF16, safetensors.F16} {
		t.Run("dequantiser/"+string(to), func(t *testing.T) { weightfmttest.TestAll(t, dequantiserDecoder{to: to}) })
	}
	t.Run("dequantiser reference/BF16", func(t *testing.T) {
		weightfmttest.TestAll(t, dequantiserDecoder{to: safetensors.BF16, reference: true})
	})
}
