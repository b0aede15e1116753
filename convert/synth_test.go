package convert

// A tiny synthetic checkpoint writer and a DST reader for tests, written
// independently of the safetensors package so that the tests check it too.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/numfmt"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// tensorData is one tensor as a test wrote or read it back.
type tensorData struct {
	dtype safetensors.DType
	shape []int64
	data  []byte
}

// checkAsIs reports where got, a tensor of an output (ok false: the output
// lacks it), is not want as it is: the same dtype, shape and bytes.
func checkAsIs(t *testing.T, name string, got tensorData, ok bool, want tensorData, what string) {
	t.Helper()
	switch {
	case !ok:
		t.Errorf("%s: %s missing", what, name)
	case got.dtype != want.dtype || !slices.Equal(got.shape, want.shape) || !bytes.Equal(got.data, want.data):
		t.Errorf("%s: %s is not byte-identical", what, name)
	}
}

type synthTensor struct {
	name string
	tensorData
}

// synth describes a small checkpoint of one family.
type synth struct {
	model    string // deepseek_v3, deepseek_v2, mixtral, qwen3_moe, qwen2_moe
	dtype    safetensors.DType
	E, I, H  int
	S        int // shared experts (deepseek), 0 otherwise
	layers   int
	dense    int // first_k_dense_replace (deepseek)
	rsf      float64
	files    int // source shards
	scaleFmt string
	seed     int64
}

func (s synth) fp8() bool { return s.dtype == safetensors.F8E4M3 }

func ceilDiv(a, b int) int64 { return int64((a + b - 1) / b) }

type synthWriter struct {
	rng     *rand.Rand
	tensors []synthTensor
}

func (w *synthWriter) add(name string, d safetensors.DType, shape ...int64) {
	n := int64(d.Size())
	for _, v := range shape {
		n *= v
	}
	b := make([]byte, n)
	switch d {
	case safetensors.BF16:
		for i := 0; i < len(b); i += 2 {
			f := float32(w.rng.NormFloat64() * 0.05)
			binary.LittleEndian.PutUint16(b[i:], numfmt.F32ToBF16(f))
		}
	case safetensors.F16:
		for i := 0; i < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], numfmt.F32ToF16(float32(w.rng.NormFloat64()*0.05)))
		}
	case safetensors.F32:
		for i := 0; i < len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(w.rng.NormFloat64()*0.01+0.02)))
		}
	default: // fp8 and others: random bytes, avoiding E4M3 NaN (0x7f, 0xff)
		for i := range b {
			v := byte(w.rng.Intn(256))
			if v&0x7f == 0x7f {
				v--
			}
			b[i] = v
		}
	}
	w.tensors = append(w.tensors, synthTensor{name, tensorData{d, shape, b}})
}

// weight adds a weight (and its scale when FP8).
func (w *synthWriter) weight(s synth, name string, rows, cols int) {
	w.add(name, s.dtype, int64(rows), int64(cols))
	if s.fp8() {
		w.add(strings.TrimSuffix(name, ".weight")+".weight_scale_inv", safetensors.F32, ceilDiv(rows, 128), ceilDiv(cols, 128))
	}
}

func (s synth) config() map[string]any {
	c := map[string]any{
		"model_type": s.model, "hidden_size": s.H, "num_hidden_layers": s.layers,
		"num_experts_per_tok": 2, "vocab_size": 16, "intermediate_size": 2 * s.I,
		"architectures": []any{"X"}, "torch_dtype": "bfloat16",
	}
	switch s.model {
	case "deepseek_v3", "deepseek_v2":
		c["moe_intermediate_size"] = s.I
		c["n_routed_experts"] = s.E
		c["n_shared_experts"] = s.S
		c["first_k_dense_replace"] = s.dense
		c["moe_layer_freq"] = 1
		c["routed_scaling_factor"] = s.rsf
		c["norm_topk_prob"] = true
		c["n_group"], c["topk_group"] = 2, 1
		if s.model == "deepseek_v3" {
			c["scoring_func"], c["topk_method"] = "sigmoid", "noaux_tc"
		} else {
			c["scoring_func"], c["topk_method"] = "softmax", "group_limited_greedy"
		}
	case "mixtral":
		c["num_local_experts"] = s.E
		c["intermediate_size"] = s.I
	case "qwen3_moe", "qwen2_moe":
		c["moe_intermediate_size"] = s.I
		c["num_experts"] = s.E
		c["norm_topk_prob"] = true
		c["decoder_sparse_step"] = 1
		c["mlp_only_layers"] = []any{}
		if s.model == "qwen2_moe" {
			c["shared_expert_intermediate_size"] = 2 * s.I
		}
	}
	if s.fp8() {
		q := map[string]any{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": []any{128, 128}, "activation_scheme": "dynamic"}
		if s.scaleFmt != "" {
			q["scale_fmt"] = s.scaleFmt
		}
		c["quantization_config"] = q
	}
	return c
}

// moePrefix is layer l's MoE module in the source.
func (s synth) moePrefix(l int) string {
	if s.model == "mixtral" {
		return fmt.Sprintf("model.layers.%d.block_sparse_moe", l)
	}
	return fmt.Sprintf("model.layers.%d.mlp", l)
}

// projNames are the gate, up, down projection names of one expert.
func (s synth) projNames() [3]string {
	if s.model == "mixtral" {
		return [3]string{"w1", "w3", "w2"}
	}
	return [3]string{"gate_proj", "up_proj", "down_proj"}
}

func (s synth) sharedModule() string {
	switch s.model {
	case "deepseek_v3", "deepseek_v2":
		if s.S > 0 {
			return "shared_experts"
		}
	case "qwen2_moe":
		return "shared_expert"
	}
	return ""
}

func (s synth) moeLayers() []int {
	var out []int
	for l := s.dense; l < s.layers; l++ {
		out = append(out, l)
	}
	return out
}

// build generates the tensors, in file order.
func (s synth) build() []synthTensor {
	w := &synthWriter{rng: rand.New(rand.NewSource(s.seed + 1))}
	H, I, E := s.H, s.I, s.E
	w.add("model.embed_tokens.weight", safetensors.BF16, 16, int64(H))
	pn := s.projNames()
	for l := 0; l < s.layers; l++ {
		lp := fmt.Sprintf("model.layers.%d.", l)
		w.add(lp+"input_layernorm.weight", safetensors.BF16, int64(H))
		w.weight(s, lp+"self_attn.o_proj.weight", H, H)
		if l < s.dense {
			w.weight(s, lp+"mlp.gate_proj.weight", 2*I, H)
			w.weight(s, lp+"mlp.up_proj.weight", 2*I, H)
			w.weight(s, lp+"mlp.down_proj.weight", H, 2*I)
		} else {
			p := s.moePrefix(l)
			// experts before the router on purpose: stacks go where the first expert was
			for e := 0; e < E; e++ {
				ep := fmt.Sprintf("%s.experts.%d.", p, e)
				w.weight(s, ep+pn[0]+".weight", I, H)
				w.weight(s, ep+pn[1]+".weight", I, H)
				w.weight(s, ep+pn[2]+".weight", H, I)
			}
			w.add(p+".gate.weight", safetensors.BF16, int64(E), int64(H))
			if s.model == "deepseek_v3" {
				w.add(p+".gate.e_score_correction_bias", safetensors.F32, int64(E))
			}
			if sm := s.sharedModule(); sm != "" {
				si := s.S * I
				if s.model == "qwen2_moe" {
					si = 2 * I
				}
				w.weight(s, p+"."+sm+".gate_proj.weight", si, H)
				w.weight(s, p+"."+sm+".up_proj.weight", si, H)
				w.weight(s, p+"."+sm+".down_proj.weight", H, si)
				if s.model == "qwen2_moe" {
					w.add(p+".shared_expert_gate.weight", safetensors.BF16, 1, int64(H))
				}
			}
		}
		w.add(lp+"post_attention_layernorm.weight", safetensors.BF16, int64(H))
	}
	w.add("model.norm.weight", safetensors.BF16, int64(H))
	w.add("lm_head.weight", safetensors.BF16, 16, int64(H))
	return w.tensors
}

// writeSynth writes s (after edit, if any) to dir as sharded safetensors plus
// config.json and a couple of other files, and returns the tensors by name.
func writeSynth(t testing.TB, dir string, s synth, edit func([]synthTensor) []synthTensor) map[string]synthTensor {
	t.Helper()
	ts := s.build()
	if edit != nil {
		ts = edit(ts)
	}
	files := max(s.files, 1)
	per := (len(ts) + files - 1) / files
	weightMap := map[string]string{}
	total := int64(0)
	for f := 0; f < files; f++ {
		lo, hi := f*per, min((f+1)*per, len(ts))
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", f+1, files)
		writeSafetensors(t, filepath.Join(dir, name), ts[lo:hi])
		for _, x := range ts[lo:hi] {
			weightMap[x.name] = name
			total += int64(len(x.data))
		}
	}
	idx, _ := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}, "", "  ")
	testkit.WriteFile(t, filepath.Join(dir, "model.safetensors.index.json"), idx)
	cfg, _ := json.MarshalIndent(s.config(), "", "  ")
	testkit.WriteFile(t, filepath.Join(dir, "config.json"), cfg)
	testkit.WriteFile(t, filepath.Join(dir, "tokenizer.json"), []byte(`{"model":"synthetic"}`))
	testkit.WriteFile(t, filepath.Join(dir, "generation_config.json"), []byte(`{"do_sample":false}`))
	testkit.WriteFile(t, filepath.Join(dir, "extra", "notes.txt"), []byte("nested file"))
	out := map[string]synthTensor{}
	for _, x := range ts {
		out[x.name] = x
	}
	return out
}

// ds3Src writes the ds3BF16 checkpoint to dir/src in a new temporary dir.
func ds3Src(t testing.TB) (dir, src string) {
	t.Helper()
	dir = t.TempDir()
	src = filepath.Join(dir, "src")
	writeSynth(t, src, ds3BF16, nil)
	return dir, src
}

func writeSafetensors(t testing.TB, path string, ts []synthTensor) {
	t.Helper()
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	off := 0
	for _, x := range ts {
		hdr[x.name] = map[string]any{"dtype": string(x.dtype), "shape": x.shape, "data_offsets": []int{off, off + len(x.data)}}
		off += len(x.data)
	}
	h, _ := json.Marshal(hdr)
	buf := testkit.STHead(h)
	for _, x := range ts {
		buf = append(buf, x.data...)
	}
	testkit.WriteFile(t, path, buf)
}

// readOut reads every tensor of an output directory through its index, with
// an independent parser, checking the index and shards agree both ways.
func readOut(t *testing.T, dir string) (map[string]tensorData, map[string]any) {
	t.Helper()
	ib := testkit.ReadFile(t, filepath.Join(dir, "model.safetensors.index.json"))
	var idx struct {
		Metadata  map[string]any    `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(ib, &idx); err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	for _, f := range idx.WeightMap {
		files[f] = true
	}
	out := map[string]tensorData{}
	var total int64
	names := slices.Sorted(maps.Keys(files))
	for _, f := range names {
		b := testkit.ReadFile(t, filepath.Join(dir, f))
		hdr, err := testkit.ParseSTHeader(b)
		if err != nil {
			t.Fatalf("%s: header: %v", f, err)
		}
		data := b[hdr.DataStart:]
		end := int64(0)
		for name, e := range hdr.Tensors {
			if idx.WeightMap[name] != f {
				t.Errorf("%s: tensor %s is in %s but the index says %q", dir, name, f, idx.WeightMap[name])
			}
			off := e.DataOffsets
			out[name] = tensorData{safetensors.DType(e.DType), e.Shape, data[off[0]:off[1]]}
			total += off[1] - off[0]
			end = max(end, off[1])
		}
		if end != int64(len(data)) {
			t.Errorf("%s: data section %d bytes, tensors end at %d", f, len(data), end)
		}
	}
	for name := range idx.WeightMap {
		if _, ok := out[name]; !ok {
			t.Errorf("index names %s, missing from the shards", name)
		}
	}
	if ts, _ := idx.Metadata["total_size"].(float64); int64(ts) != total {
		t.Errorf("index total_size %v, tensors hold %d bytes", idx.Metadata["total_size"], total)
	}
	return out, testkit.ReadJSON(t, filepath.Join(dir, "config.json"))
}
