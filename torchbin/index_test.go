package torchbin

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

const (
	shard1 = "pytorch_model-00001-of-00002.bin"
	shard2 = "pytorch_model-00002-of-00002.bin"
)

func TestOpenSharded(t *testing.T) {
	s, err := OpenSharded("testdata/sharded")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.Shards) != 2 || filepath.Base(s.Shards[0].Path) != shard1 || filepath.Base(s.Shards[1].Path) != shard2 {
		t.Fatalf("shards %v", s.Shards)
	}
	if got := s.Index.WeightMap["model.c"]; got != shard2 {
		t.Errorf("model.c in %q", got)
	}
	if ts, ok := s.Index.Metadata["total_size"].(json.Number); !ok || ts.String() != "28" {
		t.Errorf("metadata %v", s.Index.Metadata)
	}
	if _, ok := s.Shards[0].Lookup("model.b"); !ok {
		t.Error("model.b not in shard 1")
	}
}

// TestShardedBroken writes a variant of the sharded checkpoint per rule.
func TestShardedBroken(t *testing.T) {
	const good = `"model.a": "` + shard1 + `", "model.b": "` + shard1 + `", "model.c": "` + shard2 + `"`
	cases := []struct {
		name, index string
		drop        string // shard file not copied
		want        string
	}{
		{"duplicate key", `{"weight_map": {` + good + `, "model.a": "` + shard2 + `"}}`, "", `tensor "model.a" listed twice`},
		{"directory in shard name", `{"weight_map": {"model.a": "../` + shard1 + `"}}`, "", `tensor "model.a": shard name "../` + shard1 + `" is not a plain file name`},
		{"shard not a torch file", `{"weight_map": {"model.a": "model.safetensors"}}`, "", `does not end in .bin or .pt or .pth`},
		{"empty weight_map", `{"metadata": {}, "weight_map": {}}`, "", "weight_map is empty"},
		{"no weight_map", `{"metadata": {}}`, "", "no weight_map"},
		{"weight_map not strings", `{"weight_map": {"a": 1}}`, "", `tensor "a" maps to a number, not a file name`},
		{"not JSON", `{"weight_map": `, "", "JSON ends early"},
		{"missing shard", `{"weight_map": {` + good + `}}`, shard2, "shard " + shard2 + " is missing"},
		{"tensor not in map", `{"weight_map": {"model.a": "` + shard1 + `", "model.c": "` + shard2 + `"}}`, "", `tensor "model.b" is not in pytorch_model.bin.index.json`},
		{"map names absent tensor", `{"weight_map": {` + good + `, "model.z": "` + shard2 + `"}}`, "", `tensor "model.z" is mapped to ` + shard2 + `, which does not hold it`},
		{"tensor in the wrong shard", `{"weight_map": {"model.a": "` + shard2 + `", "model.b": "` + shard1 + `", "model.c": "` + shard2 + `"}}`, "", `tensor "model.a" is also in this shard, but pytorch_model.bin.index.json maps it to ` + shard2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, s := range []string{shard1, shard2} {
				if s == c.drop {
					continue
				}
				b := testkit.ReadFile(t, filepath.Join("testdata/sharded", s))
				testkit.WriteFile(t, filepath.Join(dir, s), b)
			}
			testkit.WriteFile(t, filepath.Join(dir, IndexFileName), []byte(c.index))
			s, err := OpenSharded(dir)
			if err == nil {
				s.Close()
				t.Fatal("opened without an error")
			}
			if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), dir) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q, want one line starting %q containing %q", err, dir, c.want)
			}
		})
	}
}
