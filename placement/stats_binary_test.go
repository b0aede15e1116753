package placement

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// The SGLang .pt fixtures (testdata/make_stats_fixtures.py): the stat
// mode's [passes][layers][E] int32 summed over passes, a transposed
// [layers][E] int64 read in row-major order, and each refusal naming the
// file and the place in it.
func TestReadStatsSGLangPT(t *testing.T) {
	for _, tc := range []struct {
		file   string
		layers []int
		loads  [][]float64
		err    string
	}{
		{"stat.pt", []int{0, 1, 2}, [][]float64{{11, 22, 33, 44}, {5, 0, 7, 2}, {0, 0, 0, 0}}, ""},
		{"two_d.pt", []int{0, 1}, [][]float64{{1, 2}, {3, 4}}, ""},
		{"negative.pt", nil, nil, "logical_count: pass 1, layer 1, expert 2: count -5 is not a number of tokens"},
		{"float.pt", nil, nil, "logical_count: pass 0, layer 0: counts are F32; want I32 or I64"},
		{"per_token.pt", nil, nil, "want SGLang's expert-distribution dump"},
		{"four_d.pt", nil, nil, "logical_count has shape [1 2 3 4]; want [layers][experts] or [passes][layers][experts]"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			p := filepath.Join("testdata", "sglang", tc.file)
			checkStats(t, p, tc.layers, tc.loads, tc.err)
		})
	}
}

// A .pt named otherwise is still found by its zip signature.
func TestReadStatsSGLangPTBySignature(t *testing.T) {
	b := testkit.ReadFile(t, "testdata/sglang/two_d.pt")
	p := filepath.Join(t.TempDir(), "expert_distribution_recorder_1700000000.bin")
	testkit.WriteFile(t, p, b)
	st, err := ReadStats(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]float64{{1, 2}, {3, 4}}; !reflect.DeepEqual(st.Loads, want) {
		t.Errorf("got %v, want %v", st.Loads, want)
	}
}

// stTensor is one tensor of a hand-written safetensors file.
type stTensor struct {
	dtype string
	shape []int64
	vals  []int64
}

// writeSafetensors writes a safetensors file of I64 or I32 (or F32, its
// values' bit patterns cast) tensors, for the refusals the fixture
// directory does not carry.
func writeSafetensors(t *testing.T, path string, ts map[string]stTensor) {
	t.Helper()
	header := map[string]any{}
	var data []byte
	for name, x := range ts {
		begin := len(data)
		for _, v := range x.vals {
			if x.dtype == "I64" {
				data = binary.LittleEndian.AppendUint64(data, uint64(v))
			} else {
				data = binary.LittleEndian.AppendUint32(data, uint32(v))
			}
		}
		header[name] = map[string]any{"dtype": x.dtype, "shape": x.shape, "data_offsets": []int{begin, len(data)}}
	}
	h, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(out, h...), data...)
	testkit.WriteFile(t, path, out)
}

// copyTRTLLM copies the fixture directory to a temporary one.
func copyTRTLLM(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range []string{"meta_info.json", "rank0.safetensors", "rank1.safetensors"} {
		b := testkit.ReadFile(t, filepath.Join("testdata", "trtllm", n))
		testkit.WriteFile(t, filepath.Join(dir, n), b)
	}
	return dir
}

// TensorRT-LLM's statistics directory: every rank's count of an
// (iteration, layer) summed, then the iterations, as the engine's
// generate_eplb_config.py does; what its example asserts (contiguous
// iterations, every layer at each) and every count and shape checked.
func TestReadStatsTRTLLM(t *testing.T) {
	st, err := ReadStats("testdata/trtllm")
	if err != nil {
		t.Fatal(err)
	}
	// Layer 3: [1 0 2 1]+[3 0 0 1]+[0 0 0 8]+[5 5 0 0]; layer 5 likewise.
	if want := []int{3, 5}; !reflect.DeepEqual(st.Layers, want) {
		t.Errorf("layers %v, want %v", st.Layers, want)
	}
	if want := [][]float64{{9, 5, 2, 10}, {3, 7, 7, 1}}; !reflect.DeepEqual(st.Loads, want) {
		t.Errorf("loads %v, want %v", st.Loads, want)
	}

	i64 := func(v ...int64) stTensor { return stTensor{"I64", []int64{int64(len(v))}, v} }
	for _, tc := range []struct {
		name  string
		setup func(dir string)
		err   string
	}{
		{"negative", func(dir string) {
			writeSafetensors(t, filepath.Join(dir, "rank2.safetensors"), map[string]stTensor{"100_3": i64(0, -1, 0, 0)})
		}, "rank2.safetensors: layer 3, iteration 100, expert 1: count -1 is not a number of tokens"},
		{"absurd", func(dir string) {
			writeSafetensors(t, filepath.Join(dir, "rank2.safetensors"), map[string]stTensor{"100_5": i64(0, 1<<60, 0, 0)})
		}, "rank2.safetensors: layer 5, iteration 100, expert 1: count 1152921504606846976 is not a number of tokens"},
		{"wrong shape", func(dir string) {
			writeSafetensors(t, filepath.Join(dir, "rank2.safetensors"), map[string]stTensor{"100_3": i64(1, 2, 3)})
		}, "rank2.safetensors: layer 3, iteration 100: shape [3]; want [4]"},
		{"float counts", func(dir string) {
			writeSafetensors(t, filepath.Join(dir, "rank2.safetensors"), map[string]stTensor{"100_3": {"F32", []int64{4}, []int64{0, 0, 0, 0}}})
		}, "rank2.safetensors: layer 3, iteration 100: counts are F32"},
		{"bad name", func(dir string) {
			writeSafetensors(t, filepath.Join(dir, "rank2.safetensors"), map[string]stTensor{"layer3": i64(0, 0, 0, 0)})
		}, `rank2.safetensors: tensor "layer3" is not named <iteration>_<layer>`},
		{"iteration gap", func(dir string) {
			writeSafetensors(t, filepath.Join(dir, "rank2.safetensors"), map[string]stTensor{"103_3": i64(0, 0, 0, 0), "103_5": i64(0, 0, 0, 0)})
		}, "the recorded iterations 100 to 103 have gaps (3 of them)"},
		{"layer missing at an iteration", func(dir string) {
			writeSafetensors(t, filepath.Join(dir, "rank2.safetensors"), map[string]stTensor{"102_3": i64(0, 0, 0, 0)})
		}, "layer 5 has no record for iteration 102"},
		{"no meta_info", func(dir string) { os.Remove(filepath.Join(dir, "meta_info.json")) },
			"want TensorRT-LLM's expert statistic directory"},
		{"meta_info without num_experts", func(dir string) {
			os.WriteFile(filepath.Join(dir, "meta_info.json"), []byte(`{"num_experts_per_token": 2}`), 0o644)
		}, "meta_info.json: num_experts missing"},
		{"no rank file", func(dir string) {
			os.Remove(filepath.Join(dir, "rank0.safetensors"))
			os.Remove(filepath.Join(dir, "rank1.safetensors"))
		}, "no rank*.safetensors beside meta_info.json"},
		{"truncated rank file", func(dir string) {
			os.WriteFile(filepath.Join(dir, "rank1.safetensors"), []byte("\x10\x00\x00"), 0o644)
		}, "rank1.safetensors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyTRTLLM(t)
			tc.setup(dir)
			_, err := ReadStats(dir)
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("got %v, want an error naming %s and saying %q", err, dir, tc.err)
			}
		})
	}
}

// The readers' size bound holds before a byte is parsed.
func TestReadStatsBinaryTooLarge(t *testing.T) {
	p := filepath.Join(t.TempDir(), "big.pt")
	testkit.Sparse(t, p, maxStatsBytes+1, nil)
	_, err := ReadStats(p)
	if want := fmt.Sprintf("over %d MiB", maxStatsBytes>>20); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), p) {
		t.Fatalf("got %v, want %q naming %s", err, want, p)
	}
}

// A statistics directory whose layers × experts would hold more than
// maxCells counts is refused at the layer that crosses it, before its row
// is allocated.
func TestReadStatsTRTLLMCellBound(t *testing.T) {
	dir := t.TempDir()
	const E = maxExperts
	testkit.WriteFile(t, filepath.Join(dir, "meta_info.json"), []byte(fmt.Sprintf(`{"num_experts": %d}`, E)))
	zeros := make([]int64, E)
	ts := map[string]stTensor{}
	layers := maxCells/E + 1
	for l := range layers {
		ts[fmt.Sprintf("0_%d", l)] = stTensor{"I32", []int64{E}, zeros}
	}
	writeSafetensors(t, filepath.Join(dir, "rank0.safetensors"), ts)
	_, err := ReadStats(dir)
	want := fmt.Sprintf("over %d layers of %d experts recorded; moeprep reads up to %d layers and %d counts", layers-1, E, maxLayers, maxCells)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want %q", err, want)
	}
}
