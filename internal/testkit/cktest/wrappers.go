package cktest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit/handwrap"
	"github.com/moeprep/moeprep/safetensors"
)

// WriteHand writes a checkpoint built by hand (handwrap.Hand) into a new
// directory and returns it: config.json, and every tensor filled from a
// seeded draw (BF16, N(0, 1/fan-in) rounded to nearest even; F32 for
// correction biases, 1 + 0.01 N(0,1)) in one model.safetensors.
func WriteHand(t testing.TB, h handwrap.Hand, seed uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := json.MarshalIndent(h.Config, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 30))
	names := make([]string, 0, len(h.Tensors))
	for n := range h.Tensors {
		names = append(names, n)
	}
	slices.Sort(names)
	var entries []safetensors.Entry
	for _, n := range names {
		shape := h.Tensors[n]
		count := int64(1)
		for _, d := range shape {
			count *= d
		}
		var b []byte
		dt := safetensors.BF16
		if strings.Contains(n, "correction_bias") {
			dt = safetensors.F32
			for range count {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(1+0.01*r.NormFloat64())))
			}
		} else {
			std := 1 / math.Sqrt(float64(shape[len(shape)-1]))
			for range count {
				v := math.Float32bits(float32(std * r.NormFloat64()))
				b = binary.LittleEndian.AppendUint16(b, uint16((v+0x7fff+(v>>16)&1)>>16))
			}
		}
		entries = append(entries, safetensors.Entry{Name: n, DType: dt, Shape: shape,
			Open: func() (io.Reader, error) { return bytes.NewReader(b), nil }})
	}
	if _, err := safetensors.WriteFile(context.Background(), filepath.Join(dir, "model.safetensors"), nil, entries, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// InklingMM writes the inkling-text fixture (fixtures/hf/inkling-text, as
// transformers 5.17 wrote it) as the inkling_mm_model wrapper holds it:
// the text model under model.language_model, its config under
// text_config, and an audio and a vision tower tensor beside it.
func InklingMM(t testing.TB, fixture string) string {
	t.Helper()
	ck := Open(t, fixture)
	var text map[string]any
	b, err := os.ReadFile(filepath.Join(fixture, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &text); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"model_type": "inkling_mm_model", "text_config": text,
		"audio_config": map[string]any{"hidden_size": 8}, "vision_config": map[string]any{"hidden_size": 8}})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	var entries []safetensors.Entry
	for _, n := range ck.Names() {
		tt, _ := ck.Tensor(n)
		data, err := tt.ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		name := n
		if rest, ok := strings.CutPrefix(n, "model."); ok {
			name = "model.language_model." + rest
		}
		entries = append(entries, safetensors.Entry{Name: name, DType: tt.DType, Shape: tt.Shape,
			Open: func() (io.Reader, error) { return bytes.NewReader(data), nil }})
	}
	for _, n := range []string{"model.audio_tower.norm.weight", "model.vision_tower.encoder_layers.0.projection.weight"} {
		entries = append(entries, safetensors.Entry{Name: n, DType: safetensors.BF16, Shape: []int64{4},
			Open: func() (io.Reader, error) { return bytes.NewReader(make([]byte, 8)), nil }})
	}
	if _, err := safetensors.WriteFile(context.Background(), filepath.Join(dir, "model.safetensors"), nil, entries, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}
