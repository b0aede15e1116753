package convert

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/layout"
)

// transposeOf is the naive transpose of a row-major [rows, cols] matrix of
// es-byte elements.
func transposeOf(b []byte, rows, cols, es int64) []byte {
	out := make([]byte, len(b))
	for r := range rows {
		for c := range cols {
			copy(out[(c*rows+r)*es:(c*rows+r+1)*es], b[(r*cols+c)*es:])
		}
	}
	return out
}

// TestTransposeInto: the word-wise transpose against the naive one, for
// every element size, square and ragged shapes, strided rows on both sides.
func TestTransposeInto(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, es := range []int64{1, 2, 4, 8, 3} {
		for _, sh := range [][2]int64{{1, 1}, {8, 8}, {33, 65}, {64, 7}, {5, 200}, {128, 96}} {
			m, n := sh[0], sh[1]         // src [m, n], dst [n, m]
			ss, ds := n*es+3*es, m*es+es // padded rows
			src := make([]byte, m*ss)
			for i := range src {
				src[i] = byte(r.Uint32())
			}
			dst := bytes.Repeat([]byte{0xee}, int(n*ds))
			transposeInto(dst, ds, src, ss, n, m, es)
			for a := range n {
				for c := range m {
					if !bytes.Equal(dst[a*ds+c*es:a*ds+(c+1)*es], src[c*ss+a*es:c*ss+(a+1)*es]) {
						t.Fatalf("es %d [%d,%d]: dst[%d][%d] differs", es, m, n, a, c)
					}
				}
				if pad := dst[a*ds+m*es : (a+1)*ds]; !bytes.Equal(pad, bytes.Repeat([]byte{0xee}, len(pad))) {
					t.Fatalf("es %d [%d,%d]: row %d's padding written", es, m, n, a)
				}
			}
		}
	}
}

// TestInOutIsTransposeOfOutIn converts every HF fixture and tiny preset,
// and the FP8 per-channel and per-tensor presets, in every layout (and
// fuse-shared where the family fuses) both ways: each expert slice of every
// stack of the in-out output is the transpose of the out-in output's slice
// (a gate-up slice [2I, H] transposed is [H, 2I]: row h the gate's column
// h, then the up's; a scale grid likewise), every other tensor and file is
// the same, and the contracts differ in orientation alone. Bands, chunks
// and blocks are shrunk so that a matrix spans several bands (columns read
// in strips) and reads start and end inside output rows.
func TestInOutIsTransposeOfOutIn(t *testing.T) {
	defer func(b, c, s int64) { bandMax, chunkSize, shardBlockSize = b, c, s }(bandMax, chunkSize, shardBlockSize)
	bandMax, chunkSize, shardBlockSize = 3000, 5000, 8192
	dirs, _ := filepath.Glob(filepath.Join("..", "fixtures", "hf", "*", "config.json"))
	var srcs []string
	for _, c := range dirs {
		srcs = append(srcs, filepath.Dir(c))
	}
	for _, name := range fixtures.PresetNames() {
		if !strings.HasPrefix(name, "tiny-") && !strings.Contains(name, "-fp8-") && !strings.HasSuffix(name, "-mxfp8") {
			continue
		}
		srcs = append(srcs, synthPreset(t, name))
	}
	if len(srcs) < 60 {
		t.Fatalf("only %d sources", len(srcs))
	}
	// Every layout, and fuse-shared (shared slices, folded down weights or
	// scales) where the family fuses; plain up-gate where it does not.
	runs := []Options{{}, {Layout: layout.GateUp}, {FuseShared: true, TP: 1, FoldScaling: "down", Layout: layout.UpGate}, {Layout: layout.UpGate}}
	converted := 0
	for _, src := range srcs {
		for i, o := range runs {
			name := fmt.Sprintf("%s/%s/fuse=%v/%s", filepath.Base(src), o.Layout, o.FuseShared, o.FoldScaling)
			o.Src = src
			o.Dst = filepath.Join(t.TempDir(), "out-in")
			if _, err := Convert(context.Background(), o); err != nil {
				continue // refused either way; TestHFFixtures holds the refusals to their reasons
			}
			io := o
			io.Dst, io.Orientation = filepath.Join(t.TempDir(), "in-out"), layout.InOut
			sum, err := Convert(context.Background(), io)
			if err != nil && strings.Contains(err.Error(), "no byte-exact transpose") {
				continue // packed 4-bit formats (INT4, NVFP4, MXFP4) are refused by name; see layout.TransposeRefusal
			}
			if err != nil {
				t.Fatalf("%s: out-in converts, in-out: %v", name, err)
			}
			if sum.Orientation != "in-out" {
				t.Errorf("%s: summary orientation %q", name, sum.Orientation)
			}
			checkTransposed(t, name, o.Dst, io.Dst)
			converted++
			if o.FuseShared && i == 2 {
				break // up-gate done
			}
		}
	}
	t.Logf("%d conversions compared", converted)
}

// checkTransposed compares an in-out output with the out-in one.
func checkTransposed(t *testing.T, name, outIn, inOut string) {
	t.Helper()
	a, ca := readOut(t, outIn)
	b, cb := readOut(t, inOut)
	ka, _, _ := layout.ReadContract(ca)
	kb, _, err := layout.ReadContract(cb)
	if err != nil || kb.Orientation != layout.InOut || ka.Orientation != "" {
		t.Fatalf("%s: contract orientation %q (%v), out-in %q", name, kb.Orientation, err, ka.Orientation)
	}
	stacks := map[string]bool{}
	for _, li := range kb.Layers {
		n := kb.Names(li)
		for _, s := range []string{n.Weight(layout.ProjGate), n.Weight(layout.ProjUp), n.Weight(layout.ProjGateUp), n.Weight(layout.ProjDown), n.Get(layout.ProjGate, layout.RoleScale), n.Get(layout.ProjUp, layout.RoleScale), n.Get(layout.ProjGateUp, layout.RoleScale), n.Get(layout.ProjDown, layout.RoleScale)} {
			stacks[s] = s != ""
		}
	}
	kb.Orientation = ""
	delete(ca, layout.ContractKey)
	delete(cb, layout.ContractKey)
	if !reflect.DeepEqual(ka, kb) || !reflect.DeepEqual(ca, cb) {
		t.Errorf("%s: configs differ beyond the orientation", name)
	}
	if len(a) != len(b) {
		t.Fatalf("%s: %d tensors, out-in has %d", name, len(b), len(a))
	}
	n := 0
	for tn, x := range a {
		y, ok := b[tn]
		if !ok {
			t.Fatalf("%s: %s missing", name, tn)
		}
		if !stacks[tn] {
			checkAsIs(t, tn, y, true, x, name+", a tensor that is no stack, against out-in")
			continue
		}
		n++
		if len(x.shape) != 3 || fmt.Sprint(y.shape) != fmt.Sprint([]int64{x.shape[0], x.shape[2], x.shape[1]}) || x.dtype != y.dtype {
			t.Fatalf("%s: %s is %s %v, out-in %s %v", name, tn, y.dtype, y.shape, x.dtype, x.shape)
		}
		es := int64(x.dtype.Size())
		slice := x.shape[1] * x.shape[2] * es
		for e := range x.shape[0] {
			want := transposeOf(x.data[e*slice:(e+1)*slice], x.shape[1], x.shape[2], es)
			if !bytes.Equal(y.data[e*slice:(e+1)*slice], want) {
				t.Fatalf("%s: %s expert %d is not the transpose of its out-in slice", name, tn, e)
			}
		}
	}
	if n == 0 {
		t.Fatalf("%s: no stack compared", name)
	}
}
