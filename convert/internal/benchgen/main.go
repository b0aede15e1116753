// Command benchgen writes a synthetic DeepSeek-V3-shaped checkpoint (H 7168,
// I 2048, one shared expert, 32 routed experts per layer so that a few layers
// reach benchmark size) and runs convert.Convert on it, for
// scripts/bench-convert.sh. It is a benchmark tool, not part of moeprep.
//
//	benchgen gen -dir DIR -dtype bf16|fp8 -gb 8
//	benchgen convert -src SRC -dst DST [-fuse -tp 8] [-layout stacked]
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

const (
	hidden = 7168
	inter  = 2048
	nexp   = 32
	vocab  = 32000
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchgen gen|convert ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "gen":
		err = gen(os.Args[2:])
	case "convert":
		err = run(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchgen:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("convert", flag.ExitOnError)
	src := fs.String("src", "", "source")
	dst := fs.String("dst", "", "destination")
	fuse := fs.Bool("fuse", false, "fuse-shared")
	tp := fs.Int("tp", 1, "tp")
	lay := fs.String("layout", "stacked", "layout")
	jobs := fs.Int("jobs", 0, "jobs")
	fs.Parse(args)
	l, err := layout.Parse(*lay)
	if err != nil {
		return err
	}
	sum, err := convert.Convert(context.Background(), convert.Options{Src: *src, Dst: *dst, Layout: l, FuseShared: *fuse, TP: *tp, Jobs: *jobs})
	if err != nil {
		return err
	}
	b, _ := json.Marshal(sum)
	fmt.Println(string(b))
	return nil
}

// noise is a cheap deterministic byte stream (xorshift64*), F32 scales kept
// finite and positive, FP8 bytes kept off the NaN pattern.
type noise struct {
	s     uint64
	left  int64
	dtype safetensors.DType
}

func (n *noise) Read(p []byte) (int, error) {
	if n.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > n.left {
		p = p[:n.left]
	}
	p = p[:len(p)/8*8]
	for i := 0; i < len(p); i += 8 {
		n.s ^= n.s >> 12
		n.s ^= n.s << 25
		n.s ^= n.s >> 27
		v := n.s * 2685821657736338717
		switch n.dtype {
		case safetensors.F32:
			binary.LittleEndian.PutUint32(p[i:], math.Float32bits(1e-4*float32(v>>40)/float32(1<<24)+1e-5))
			binary.LittleEndian.PutUint32(p[i+4:], math.Float32bits(1e-4*float32(v&0xffffff)/float32(1<<24)+1e-5))
		case safetensors.BF16:
			for k := 0; k < 4; k++ { // small normal values: sign, exponent 120..123
				h := uint16(v>>(16*k)) & 0x81ff
				binary.LittleEndian.PutUint16(p[i+2*k:], h|0x3c00)
			}
		default:
			binary.LittleEndian.PutUint64(p[i:], v&0x7e7e7e7e7e7e7e7e)
		}
	}
	n.left -= int64(len(p))
	return len(p), nil
}

type tensor struct {
	name  string
	dtype safetensors.DType
	shape []int64
}

func (t tensor) bytes() int64 {
	n := int64(t.dtype.Size())
	for _, d := range t.shape {
		n *= d
	}
	return n
}

func gen(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ExitOnError)
	dir := fs.String("dir", "", "output directory")
	dt := fs.String("dtype", "bf16", "bf16 or fp8")
	gb := fs.Float64("gb", 8, "minimum size in GB")
	fs.Parse(args)
	fp8 := *dt == "fp8"
	wd := safetensors.BF16
	if fp8 {
		wd = safetensors.F8E4M3
	}
	weight := func(name string, rows, cols int64) []tensor {
		ts := []tensor{{name, wd, []int64{rows, cols}}}
		if fp8 {
			ts = append(ts, tensor{name + "_scale_inv", safetensors.F32, []int64{(rows + 127) / 128, (cols + 127) / 128}})
		}
		return ts
	}
	var files [][]tensor
	files = append(files, []tensor{{"model.embed_tokens.weight", safetensors.BF16, []int64{vocab, hidden}}, {"model.norm.weight", safetensors.BF16, []int64{hidden}}, {"lm_head.weight", safetensors.BF16, []int64{vocab, hidden}}})
	var total int64
	for _, t := range files[0] {
		total += t.bytes()
	}
	layers := 0
	for total < int64(*gb*1e9) {
		l := layers
		p := fmt.Sprintf("model.layers.%d.", l)
		var ts []tensor
		ts = append(ts, tensor{p + "input_layernorm.weight", safetensors.BF16, []int64{hidden}})
		ts = append(ts, weight(p+"self_attn.q_a_proj.weight", 1536, hidden)...)
		ts = append(ts, weight(p+"self_attn.o_proj.weight", hidden, 16384)...)
		for e := 0; e < nexp; e++ {
			ep := fmt.Sprintf("%smlp.experts.%d.", p, e)
			ts = append(ts, weight(ep+"gate_proj.weight", inter, hidden)...)
			ts = append(ts, weight(ep+"up_proj.weight", inter, hidden)...)
			ts = append(ts, weight(ep+"down_proj.weight", hidden, inter)...)
		}
		ts = append(ts, tensor{p + "mlp.gate.weight", safetensors.BF16, []int64{nexp, hidden}}, tensor{p + "mlp.gate.e_score_correction_bias", safetensors.F32, []int64{nexp}})
		ts = append(ts, weight(p+"mlp.shared_experts.gate_proj.weight", inter, hidden)...)
		ts = append(ts, weight(p+"mlp.shared_experts.up_proj.weight", inter, hidden)...)
		ts = append(ts, weight(p+"mlp.shared_experts.down_proj.weight", hidden, inter)...)
		ts = append(ts, tensor{p + "post_attention_layernorm.weight", safetensors.BF16, []int64{hidden}})
		for _, t := range ts {
			total += t.bytes()
		}
		files = append(files, ts)
		layers++
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	idx := &safetensors.Index{Metadata: map[string]any{"total_size": total}, WeightMap: map[string]string{}}
	for i, ts := range files {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(files))
		var entries []safetensors.Entry
		for k, t := range ts {
			seed := uint64(i*100000+k) | 1
			entries = append(entries, safetensors.Entry{Name: t.name, DType: t.dtype, Shape: t.shape,
				Open: func() (io.Reader, error) {
					return &noise{s: seed * 0x9E3779B97F4A7C15, left: t.bytes(), dtype: t.dtype}, nil
				}})
			idx.WeightMap[t.name] = name
		}
		if _, err := safetensors.WriteFile(context.Background(), filepath.Join(*dir, name), map[string]string{"format": "pt"}, entries, nil); err != nil {
			return err
		}
	}
	if err := safetensors.WriteIndex(filepath.Join(*dir, safetensors.IndexFileName), idx); err != nil {
		return err
	}
	cfg := map[string]any{
		"model_type": "deepseek_v3", "architectures": []string{"DeepseekV3ForCausalLM"},
		"hidden_size": hidden, "intermediate_size": 18432, "moe_intermediate_size": inter,
		"n_routed_experts": nexp, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
		"routed_scaling_factor": 2.5, "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
		"first_k_dense_replace": 0, "moe_layer_freq": 1, "num_hidden_layers": layers, "vocab_size": vocab,
	}
	if fp8 {
		cfg["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": []int{128, 128}, "activation_scheme": "dynamic"}
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(filepath.Join(*dir, "config.json"), b, 0o644); err != nil {
		return err
	}
	fmt.Printf("%s: %d layers, %.2f GB of tensors\n", *dir, layers, float64(total)/1e9)
	return nil
}
