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

	"github.com/moeprep/moeprep/checkpoint"
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
	var entries modelFile
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
		entries.add(n, dt, shape, b)
	}
	entries.write(t, dir)
	return dir
}

// InklingMM writes the inkling-text fixture (fixtures/hf/inkling-text, as
// transformers 5.17 wrote it) as the inkling_mm_model wrapper holds it:
// the text model under model.language_model, its config under
// text_config, and an audio and a vision tower tensor beside it.
func InklingMM(t testing.TB, fixture string) string {
	t.Helper()
	ck := Open(t, fixture)
	dir := inklingMMDir(t, fixture, "src")
	var entries modelFile
	for _, n := range ck.Names() {
		tt, _ := ck.Tensor(n)
		name := n
		if rest, ok := strings.CutPrefix(n, "model."); ok {
			name = "model.language_model." + rest
		}
		entries.add(name, tt.DType, tt.Shape, readTensor(t, ck, fixture, n))
	}
	for _, n := range []string{"model.audio_tower.norm.weight", "model.vision_tower.encoder_layers.0.projection.weight"} {
		entries.add(n, safetensors.BF16, []int64{4}, make([]byte, 8))
	}
	entries.write(t, dir)
	return dir
}

// modelFile is the tensors of one model.safetensors, each held in memory
// (test checkpoints are small).
type modelFile []safetensors.Entry

func (m *modelFile) add(name string, dt safetensors.DType, shape []int64, data []byte) {
	*m = append(*m, safetensors.Entry{Name: name, DType: dt, Shape: shape,
		Open: func() (io.Reader, error) { return bytes.NewReader(data), nil }})
}

// write writes the tensors as dir's model.safetensors.
func (m modelFile) write(t testing.TB, dir string) {
	t.Helper()
	if _, err := safetensors.WriteFile(context.Background(), filepath.Join(dir, "model.safetensors"), nil, m, nil); err != nil {
		t.Fatal(err)
	}
}

// readTensor reads tensor n of ck, the checkpoint in dir, whole.
func readTensor(t testing.TB, ck *checkpoint.Checkpoint, dir, n string) []byte {
	t.Helper()
	tt, ok := ck.Tensor(n)
	if !ok {
		t.Fatalf("%s: no tensor %s", dir, n)
	}
	data, err := tt.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// inklingMMDir makes dir name under a temporary directory with the
// inkling_mm_model wrapper's config.json around text's config.json.
func inklingMMDir(t testing.TB, text, name string) string {
	t.Helper()
	var cfgText map[string]any
	b, err := os.ReadFile(filepath.Join(text, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &cfgText); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"model_type": "inkling_mm_model", "text_config": cfgText,
		"audio_config": map[string]any{"hidden_size": 8}, "vision_config": map[string]any{"hidden_size": 8}})
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// InklingHub writes an inkling_text checkpoint in transformers' layout
// (model.layers.L, experts.gate_up_proj gate rows then up rows, shared
// gate_proj/up_proj/down_proj stacks: fixtures/hf/inkling-text, or one
// fixtures.Write made) as the inkling_mm_model wrapper in the hub's layout,
// the inverse of transformers 5.17's inkling_mm_model mapping: the text
// model under model.llm (layers model.llm.layers.L), experts.w13_weight
// with each expert's gate rows at the even rows and its up rows at the odd
// ones (Interleave(dim=1) reversed), experts.w2_weight,
// shared_experts.shared_w13_weight (gate_proj and up_proj interleaved
// alike) and shared_w2_weight, the correction bias gate.bias; an audio and
// a vision tensor beside it.
func InklingHub(t testing.TB, src string) string {
	t.Helper()
	ck := Open(t, src)
	dir := inklingMMDir(t, src, "hub")
	read := func(n string) []byte { return readTensor(t, ck, src, n) }
	// interleave writes, per slice of s, row j of gate at row 2j and row j
	// of up at row 2j+1 (rows of rowBytes bytes, i of each per slice).
	interleave := func(gate, up []byte, s, i, rowBytes int) []byte {
		out := make([]byte, 0, len(gate)+len(up))
		for e := range s {
			for j := range i {
				at := (e*i + j) * rowBytes
				out = append(append(out, gate[at:at+rowBytes]...), up[at:at+rowBytes]...)
			}
		}
		return out
	}
	var entries modelFile
	add := entries.add
	for _, n := range ck.Names() {
		tt, _ := ck.Tensor(n)
		name := strings.Replace(n, "model.", "model.llm.", 1)
		if n == "lm_head.weight" {
			name = "model.llm.unembed.weight"
		}
		switch {
		case strings.HasSuffix(n, ".mlp.experts.gate_up_proj"):
			e, i2, h := int(tt.Shape[0]), int(tt.Shape[1]), int(tt.Shape[2])
			data, rb := read(n), h*tt.DType.Size()
			half := i2 / 2 * rb
			var gate, up []byte
			for x := range e {
				slice := data[x*i2*rb : (x+1)*i2*rb]
				gate, up = append(gate, slice[:half]...), append(up, slice[half:]...)
			}
			add(strings.TrimSuffix(name, "gate_up_proj")+"w13_weight", tt.DType, tt.Shape, interleave(gate, up, e, i2/2, rb))
		case strings.HasSuffix(n, ".mlp.experts.down_proj"):
			add(strings.TrimSuffix(name, "down_proj")+"w2_weight", tt.DType, tt.Shape, read(n))
		case strings.HasSuffix(n, ".mlp.shared_experts.gate_proj"):
			s, i, h := int(tt.Shape[0]), int(tt.Shape[1]), int(tt.Shape[2])
			up := read(strings.TrimSuffix(n, "gate_proj") + "up_proj")
			add(strings.TrimSuffix(name, "gate_proj")+"shared_w13_weight", tt.DType, []int64{int64(s), int64(2 * i), int64(h)},
				interleave(read(n), up, s, i, h*tt.DType.Size()))
		case strings.HasSuffix(n, ".mlp.shared_experts.up_proj"):
		case strings.HasSuffix(n, ".mlp.shared_experts.down_proj"):
			add(strings.TrimSuffix(name, "down_proj")+"shared_w2_weight", tt.DType, tt.Shape, read(n))
		case strings.HasSuffix(n, ".mlp.gate.e_score_correction_bias"):
			add(strings.TrimSuffix(name, "e_score_correction_bias")+"bias", tt.DType, tt.Shape, read(n))
		default:
			add(name, tt.DType, tt.Shape, read(n))
		}
	}
	for _, n := range []string{"model.audio.final_norm.weight", "model.visual.final_norm.weight"} {
		add(n, safetensors.BF16, []int64{4}, make([]byte, 8))
	}
	entries.write(t, dir)
	return dir
}
