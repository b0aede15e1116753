package checkpoint

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

const hf = "../fixtures/hf"

// The torch copies of two HF fixtures hold exactly the safetensors copies'
// tensors: the same names, dtypes, shapes and bytes, whichever reader maps them.
func TestTorchAndSafetensorsAgree(t *testing.T) {
	pairs := []struct{ st, torch string }{
		{"mixtral", "mixtral-bin-sharded"},
		{"qwen3-moe", "qwen3-moe-bin"},
	}
	for _, p := range pairs {
		a, err := Open(filepath.Join(hf, p.st))
		if err != nil {
			t.Fatal(err)
		}
		b, err := Open(filepath.Join(hf, p.torch))
		if err != nil {
			t.Fatal(err)
		}
		if a.Format != FormatSafetensors || b.Format != FormatTorch {
			t.Errorf("formats %s/%s", a.Format, b.Format)
		}
		if len(a.Tensors) != len(b.Tensors) || len(a.Tensors) < 50 {
			t.Fatalf("%s: %d tensors vs %d", p.torch, len(a.Tensors), len(b.Tensors))
		}
		nonZero := 0
		for _, ta := range a.Tensors {
			tb, ok := b.Tensor(ta.Name)
			if !ok {
				t.Fatalf("%s lacks %s", p.torch, ta.Name)
			}
			if ta.DType != tb.DType || !slices.Equal(ta.Shape, tb.Shape) {
				t.Fatalf("%s: %s %v vs %s %v", ta.Name, ta.DType, ta.Shape, tb.DType, tb.Shape)
			}
			ba, bb := readAll(t, ta), readAll(t, tb)
			if !bytes.Equal(ba, bb) {
				t.Fatalf("%s: bytes differ between %s and %s", ta.Name, p.st, p.torch)
			}
			if bytes.Count(ba, []byte{0}) < len(ba) {
				nonZero++
			}
		}
		if nonZero != len(a.Tensors) {
			t.Errorf("%s: %d of %d tensors are all zero bytes: a comparison on zeros proves nothing", p.st, len(a.Tensors)-nonZero, len(a.Tensors))
		}
		if a.TotalBytes() != b.TotalBytes() || a.TotalBytes() <= 0 {
			t.Errorf("total bytes %d vs %d", a.TotalBytes(), b.TotalBytes())
		}
		a.Close()
		b.Close()
	}
}

func TestOpenFormats(t *testing.T) {
	tests := []struct {
		dir, format string
		weightFiles []string
	}{
		{"deepseek-v3-bf16", FormatSafetensors, []string{"model.safetensors.index.json", "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"}},
		{"qwen2-moe", FormatSafetensors, []string{"model.safetensors"}},
		{"mixtral-bin-sharded", FormatTorch, []string{"pytorch_model.bin.index.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"}},
		{"qwen3-moe-bin", FormatTorch, []string{"pytorch_model.bin"}},
	}
	for _, tt := range tests {
		c, err := Open(filepath.Join(hf, tt.dir))
		if err != nil {
			t.Fatal(err)
		}
		if c.Format != tt.format || strings.Join(c.WeightFiles, ",") != strings.Join(tt.weightFiles, ",") {
			t.Errorf("%s: format %s files %v, want %s %v", tt.dir, c.Format, c.WeightFiles, tt.format, tt.weightFiles)
		}
		other, err := c.OtherFiles()
		if err != nil {
			t.Fatal(err)
		}
		joined := strings.Join(other, ",")
		if !strings.Contains(joined, "generation_config.json") || !strings.Contains(joined, filepath.Join("reference", "moe-layer-")) {
			t.Errorf("%s: other files %v lack generation_config.json or reference/", tt.dir, other)
		}
		for _, f := range other {
			if f == ConfigFileName {
				t.Errorf("%s: config.json listed as an other file (converters rewrite it)", tt.dir)
			}
		}
		for _, w := range tt.weightFiles {
			if strings.Contains(joined, w) {
				t.Errorf("%s: weight file %s listed as other file", tt.dir, w)
			}
		}
		c.Close()
	}
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	testkit.WriteFile(t, filepath.Join(dir, name), content)
}

func TestOpenErrors(t *testing.T) {
	single := filepath.Join(hf, "qwen3-moe", "model.safetensors")
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
	}{
		{"no config", func(t *testing.T, dir string) { testkit.CopyFile(t, single, filepath.Join(dir, "model.safetensors")) }, "config.json: no such file"},
		{"config not object", func(t *testing.T, dir string) { write(t, dir, "config.json", "[1,2]") }, "config.json: not a JSON object"},
		{"config null", func(t *testing.T, dir string) { write(t, dir, "config.json", "null") }, "config.json: not a JSON object"},
		{"no weights", func(t *testing.T, dir string) { write(t, dir, "config.json", "{}") }, "no weights found"},
		{"two safetensors no index", func(t *testing.T, dir string) {
			write(t, dir, "config.json", "{}")
			testkit.CopyFile(t, single, filepath.Join(dir, "a.safetensors"))
			testkit.CopyFile(t, single, filepath.Join(dir, "b.safetensors"))
		}, "2 .safetensors files but no model.safetensors.index.json"},
		{"two bins no index", func(t *testing.T, dir string) {
			write(t, dir, "config.json", "{}")
			testkit.CopyFile(t, filepath.Join(hf, "qwen3-moe-bin", "pytorch_model.bin"), filepath.Join(dir, "a.bin"))
			testkit.CopyFile(t, filepath.Join(hf, "qwen3-moe-bin", "pytorch_model.bin"), filepath.Join(dir, "b.bin"))
		}, "2 PyTorch files but no pytorch_model.bin.index.json"},
		{"missing shard", func(t *testing.T, dir string) {
			write(t, dir, "config.json", "{}")
			testkit.CopyFile(t, filepath.Join(hf, "mixtral-bin-sharded", "pytorch_model.bin.index.json"), filepath.Join(dir, "pytorch_model.bin.index.json"))
			testkit.CopyFile(t, filepath.Join(hf, "mixtral-bin-sharded", "pytorch_model-00001-of-00002.bin"), filepath.Join(dir, "pytorch_model-00001-of-00002.bin"))
		}, "pytorch_model-00002-of-00002.bin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(t, dir)
			c, err := Open(dir)
			if err == nil {
				c.Close()
				t.Fatalf("opened a broken checkpoint")
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q, want one line containing %q", err, tt.want)
			}
		})
	}
	if _, err := Open(single); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a file as checkpoint dir: %v", err)
	}
}

// readAll is tn's bytes; a read error fails t (cktest.ReadAll, which
// checkpoint's own tests cannot import).
func readAll(t *testing.T, tn *Tensor) []byte {
	t.Helper()
	b, err := tn.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// SmallTensorBytes, served from one window read for many neighbouring
// tensors, returns each tensor's own bytes: every small tensor of a
// sharded fixture, in file order and then backwards (a window from the
// other end), equals a direct read; one over max is refused.
func TestSmallTensorBytesWindow(t *testing.T) {
	c, err := Open(filepath.Join(hf, "mixtral"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var small []*Tensor
	for _, tn := range c.Tensors {
		if n := tn.NumBytes(); n > 0 && n <= 4096 {
			small = append(small, tn)
		}
	}
	if len(small) < 20 {
		t.Fatalf("%d small tensors: too few to test the window", len(small))
	}
	backward := slices.Clone(small)
	slices.Reverse(backward)
	for _, order := range [][]*Tensor{small, backward} {
		for _, tn := range order {
			got, err := c.SmallTensorBytes(tn.Name, 4096)
			if err != nil {
				t.Fatal(err)
			}
			if want := readAll(t, tn); !bytes.Equal(got, want) {
				t.Fatalf("%s: window bytes differ from a direct read", tn.Name)
			}
		}
	}
	if _, err := c.SmallTensorBytes(small[0].Name, small[0].NumBytes()-1); err == nil {
		t.Errorf("%s: a tensor over max was read", small[0].Name)
	}
}
