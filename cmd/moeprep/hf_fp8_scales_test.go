package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// squeezedScaleCheckpoint copies the HF DeepSeek-V3 FP8 fixture with every
// expert's weight_scale_inv stored as transformers 5.17 saves the FP8
// checkpoints it quantises itself (FineGrainedFP8Config + save_pretrained):
// the size-1 dimension of the block grid dropped, [1,2] and [2,1] both
// written as [2]. It returns the directory and how many tensors it changed.
func squeezedScaleCheckpoint(t *testing.T) (string, int) {
	t.Helper()
	src := filepath.Join(fixturesDir, "deepseek-v3-fp8")
	dst := filepath.Join(t.TempDir(), "hf-fp8-squeezed")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	expertScale := regexp.MustCompile(`\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight_scale_inv$`)
	changed := 0
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		in := filepath.Join(src, e.Name())
		if !strings.HasSuffix(e.Name(), ".safetensors") {
			b := testkit.ReadFile(t, in)
			testkit.WriteFile(t, filepath.Join(dst, e.Name()), b)
			continue
		}
		f, err := safetensors.Open(in)
		if err != nil {
			t.Fatal(err)
		}
		var out []safetensors.Entry
		for _, ti := range f.Tensors {
			shape := ti.Shape
			if expertScale.MatchString(ti.Name) {
				var sq []int64
				for _, d := range shape {
					if d != 1 {
						sq = append(sq, d)
					}
				}
				if len(sq) != len(shape) {
					shape, changed = sq, changed+1
				}
			}
			sec, err := f.Section(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, safetensors.Entry{Name: ti.Name, DType: ti.DType, Shape: shape,
				Open: func() (io.Reader, error) { return io.NewSectionReader(sec, 0, sec.Size()), nil }})
		}
		if _, err := safetensors.WriteFile(context.Background(), filepath.Join(dst, e.Name()), f.Metadata, out, nil); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	return dst, changed
}

// An FP8 checkpoint whose expert block scales transformers saved squeezed
// is read as the same block grid: inspect, convert, fuse-shared and
// validate against the HF goldens all pass, with the numbers of the
// unsqueezed fixture.
func TestSqueezedExpertScales(t *testing.T) {
	src, changed := squeezedScaleCheckpoint(t)
	if changed < 2*16*3 { // 2 MoE layers x 16 experts x gate, up, down
		t.Fatalf("squeezed %d expert scales, expected every one", changed)
	}
	if code, _, stderr := runCLI(t, "inspect", src); code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, stderr)
	}
	golden := filepath.Join(fixturesDir, "deepseek-v3-fp8", "reference")
	for _, args := range [][]string{
		{"convert", "--no-progress"},
		{"convert", "--layout", "gate-up", "--no-progress"},
		{"fuse-shared", "--tp", "4", "--no-progress"},
	} {
		dst := filepath.Join(t.TempDir(), "out")
		if code, _, stderr := runCLI(t, append(args, src, dst)...); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		code, stdout, stderr := runCLI(t, "validate", "--no-progress", "--device", "cpu", "--golden", golden, src, dst)
		if code != 0 || !strings.Contains(stdout, "PASS") || strings.Contains(stdout, "FAIL") {
			t.Fatalf("%v then validate: exit %d\n%s%s", args, code, stdout, stderr)
		}
	}
}
