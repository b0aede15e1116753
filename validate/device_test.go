package validate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/testkit"
)

// withCUDA makes cuda.Available report err (nil: a usable GPU) for one test.
func withCUDA(t *testing.T, err error) {
	t.Helper()
	old := cudaAvailable
	cudaAvailable = func() error { return err }
	t.Cleanup(func() { cudaAvailable = old })
}

// TestSelectDevice: auto picks CUDA when it is usable and otherwise falls
// back to the CPU with one notice line; cuda without a GPU, unknown
// devices and precisions, and GPU block sizes that are no multiple of 16
// are refused.
func TestSelectDevice(t *testing.T) {
	other := errors.New("cuda: cuInit: CUDA_ERROR_INSUFFICIENT_DRIVER (35)")
	tests := []struct {
		device      Device
		precision   Precision
		block       int
		avail       error
		want        Device
		prec        Precision
		notice, err string
	}{
		{"", "", 64, nil, DeviceCUDA, PrecisionBF16, "", ""},
		{"auto", "f32", 64, nil, DeviceCUDA, PrecisionF32, "", ""},
		{"AUTO", "fp32", 16, nil, DeviceCUDA, PrecisionF32, "", ""},
		{"auto", "", 64, cuda.ErrNoDriver, DeviceCPU, PrecisionBF16, "validate: no CUDA driver (libcuda.so.1 not found); running on the CPU", ""},
		{"", "", 64, fmt.Errorf("wrapped: %w", cuda.ErrNoDevice), DeviceCPU, PrecisionBF16, "validate: no CUDA device (the driver reports none); running on the CPU", ""},
		{"auto", "", 64, other, DeviceCPU, PrecisionBF16, "validate: CUDA unusable (" + other.Error() + "); running on the CPU", ""},
		{"auto", "", 8, cuda.ErrNoDriver, DeviceCPU, PrecisionBF16, "validate: no CUDA driver (libcuda.so.1 not found); running on the CPU", ""},
		{"cpu", "", 8, nil, DeviceCPU, PrecisionBF16, "", ""},
		{"cuda", "", 128, nil, DeviceCUDA, PrecisionBF16, "", ""},
		{"gpu", "bf16", 16, nil, DeviceCUDA, PrecisionBF16, "", ""},
		{"cuda", "fp8", 16, nil, DeviceCUDA, PrecisionFP8, "", ""},
		{"cuda", "w8a8", 16, nil, DeviceCUDA, PrecisionFP8, "", ""},
		{"cuda", "", 64, cuda.ErrNoDriver, "", "", "", "validate --device cuda: no usable GPU: cuda: no NVIDIA driver (libcuda.so.1 not found); use --device cpu or auto"},
		{"cuda", "", 24, nil, "", "", "", "--block-size 24: the GPU grouped GEMM needs a multiple of 16"},
		{"auto", "", 8, nil, "", "", "", "--block-size 8: the GPU grouped GEMM needs a multiple of 16"},
		{"tpu", "", 64, nil, "", "", "", "unknown --device \"tpu\""},
		{"cuda", "fp16", 64, nil, "", "", "", "GPU precision \"fp16\""},
	}
	for _, tt := range tests {
		var lines []string
		o := Options{Device: tt.device, GPUPrecision: tt.precision, BlockSize: tt.block, Progress: func(m string) { lines = append(lines, m) }}
		notes, err := o.selectDevice(func() error { return tt.avail })
		name := fmt.Sprintf("device %q precision %q block %d avail %v", tt.device, tt.precision, tt.block, tt.avail)
		if tt.err != "" {
			testkit.ErrorContains(t, err, tt.err, name)
			if tt.avail != nil && !errors.Is(err, ErrDeviceUnavailable) {
				t.Errorf("%s: %v is not ErrDeviceUnavailable", name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if o.Device != tt.want || o.GPUPrecision != tt.prec {
			t.Errorf("%s: device %q precision %q, want %q %q", name, o.Device, o.GPUPrecision, tt.want, tt.prec)
		}
		if tt.notice == "" {
			if len(lines) != 0 || len(notes) != 0 {
				t.Errorf("%s: unexpected notice %q / notes %q", name, lines, notes)
			}
			continue
		}
		if len(lines) != 1 || lines[0] != tt.notice {
			t.Errorf("%s: notice %q, want %q", name, lines, tt.notice)
		}
		if len(notes) != 1 || !strings.Contains(notes[0], "running on the CPU (--device auto)") {
			t.Errorf("%s: report notes %q", name, notes)
		}
	}
}

// TestAutoFallbackRun: a whole run with --device auto on a machine without
// a driver runs on the CPU, says so once (through Notice when set, not
// Progress) and records it in the report; --device cuda there is exit 2.
func TestAutoFallbackRun(t *testing.T) {
	withCUDA(t, cuda.ErrNoDriver)
	src := filepath.Join(hfFixtures, "qwen3-moe")
	var notices, progress []string
	rep, err := Run(context.Background(), Options{Src: src, Golden: src, Device: "auto", Layers: "sample:1",
		Notice: func(m string) { notices = append(notices, m) }, Progress: func(m string) { progress = append(progress, m) }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Device != DeviceCPU || rep.Failed() {
		t.Fatalf("device %q, failed %v", rep.Device, rep.Failed())
	}
	if len(notices) != 1 || notices[0] != "validate: no CUDA driver (libcuda.so.1 not found); running on the CPU" {
		t.Errorf("notices %q", notices)
	}
	for _, p := range progress {
		if strings.Contains(p, "running on the CPU") {
			t.Errorf("the notice also went to Progress: %q", p)
		}
	}
	var b jsonBuf
	rep.WriteTable(&b)
	if !strings.Contains(b.String(), "note: no CUDA driver (libcuda.so.1 not found); running on the CPU (--device auto)") {
		t.Errorf("report lacks the fallback note:\n%s", b)
	}
	_, err = Run(context.Background(), Options{Src: src, Golden: src, Device: "cuda"})
	if !errors.Is(err, ErrDeviceUnavailable) || !errors.Is(err, cuda.ErrNoDriver) || exitcode.Code(err) != exitcode.BadInput {
		t.Errorf("--device cuda without a driver: %v (exit %d)", err, exitcode.Code(err))
	}
}

func TestRefSampled(t *testing.T) {
	mk := func(idx ...int) []target {
		var ts []target
		for _, i := range idx {
			ts = append(ts, target{index: i})
		}
		return ts
	}
	tests := []struct {
		targets []target
		want    []int
	}{
		{mk(3), []int{3}},
		{mk(1, 2, 3, 4), []int{1, 2, 3, 4}},
		{mk(1, 2, 3, 4, 5), []int{1, 5}},
		{mk(3, 4, 5, 6, 7, 61), []int{3, 61}},
	}
	for _, tt := range tests {
		got := refSampled(tt.targets, "")
		if len(got) != len(tt.want) {
			t.Errorf("%v: sampled %v, want %v", tt.targets, got, tt.want)
		}
		for _, i := range tt.want {
			if !got[i] {
				t.Errorf("%v: layer %d not sampled (%v)", tt.targets, i, got)
			}
		}
	}
}

// GPURefused: the GPU's refusal of a run's weights is the error under
// --device cuda and the CPU, with a notice and a report note, under auto
// (the per-rank recomposition applies it as Run does).
func TestGPURefused(t *testing.T) {
	why := "FP8 expert weights (quantization fp8_block_32, F32 scales) have no GPU path"
	for _, asked := range []string{"cuda", " CUDA", "gpu"} {
		o := Options{Device: DeviceCUDA}
		if _, err := o.GPURefused(asked, why); err == nil || err.Error() != "validate --device cuda: "+why+"; use --device cpu or auto" || o.Device != DeviceCUDA {
			t.Errorf("%q: %v, device %s", asked, err, o.Device)
		}
	}
	for _, asked := range []string{"auto", "", "Auto"} {
		var notices []string
		o := Options{Device: DeviceCUDA, Notice: func(m string) { notices = append(notices, m) }}
		note, err := o.GPURefused(asked, why)
		if err != nil || o.Device != DeviceCPU || note != why+"; running on the CPU (--device auto)" ||
			len(notices) != 1 || notices[0] != "validate: "+why+"; running on the CPU" {
			t.Errorf("%q: note %q, %v, device %s, notices %q", asked, note, err, o.Device, notices)
		}
	}
}
