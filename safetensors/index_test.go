package safetensors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestWriteIndexFormat pins the bytes transformers writes: sorted keys,
// two-space indent, trailing newline, large integers kept exact.
func TestWriteIndexFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), IndexFileName)
	idx := &Index{
		Metadata: map[string]any{"total_size": json.Number("1342177280123456789")},
		WeightMap: map[string]string{
			"model.norm.weight":  "model-00002-of-00002.safetensors",
			"lm_head.weight":     "model-00002-of-00002.safetensors",
			"model.embed.weight": "model-00001-of-00002.safetensors",
		},
	}
	if err := WriteIndex(path, idx); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := `{
  "metadata": {
    "total_size": 1342177280123456789
  },
  "weight_map": {
    "lm_head.weight": "model-00002-of-00002.safetensors",
    "model.embed.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors"
  }
}
`
	if string(got) != want {
		t.Errorf("index file\n%s\nwant\n%s", got, want)
	}
	back, err := ReadIndex(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, idx) {
		t.Errorf("read back %+v, want %+v", back, idx)
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf(".tmp left behind: %v", err)
	}
	// No metadata is written as an empty object, as transformers always has one.
	if err := WriteIndex(path, &Index{WeightMap: map[string]string{"a": "m.safetensors"}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); !bytes.HasPrefix(got, []byte("{\n  \"metadata\": {},\n")) {
		t.Errorf("index without metadata:\n%s", got)
	}
}

func TestWriteIndexRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		idx  *Index
		want string
	}{
		{&Index{}, "empty weight_map"},
		{&Index{WeightMap: map[string]string{"a": "sub/m.safetensors"}}, `tensor "a": shard name "sub/m.safetensors" is not a plain file name`},
		{&Index{WeightMap: map[string]string{"a": "m.bin"}}, `does not end in .safetensors`},
	} {
		path := filepath.Join(dir, IndexFileName)
		err := WriteIndex(path, c.idx)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), path) {
			t.Errorf("error %v, want %q naming the file", err, c.want)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("refused index was written: %v", err)
		}
	}
}

func TestReadIndexAccepts(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, IndexFileName)
	body := ` {"weight_map": {"a": "x.safetensors"}, "extra": [1, {"b": null}], "metadata": null}` + "\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	idx, err := ReadIndex(path)
	if err != nil {
		t.Fatal(err)
	}
	if idx.Metadata != nil || !reflect.DeepEqual(idx.WeightMap, map[string]string{"a": "x.safetensors"}) {
		t.Errorf("read %+v", idx)
	}
}

// TestOpenSharded writes a two-shard checkpoint with the writer and reads
// every tensor back through the index.
func TestOpenSharded(t *testing.T) {
	dir := t.TempDir()
	shards := map[string][]Entry{
		"model-00002-of-00002.safetensors": {
			bytesEntry("lm_head.weight", BF16, []int64{4, 3}, randomBytes(10, 24)),
			bytesEntry("model.norm.weight", F32, []int64{3}, randomBytes(11, 12)),
		},
		"model-00001-of-00002.safetensors": {
			bytesEntry("model.embed_tokens.weight", BF16, []int64{5, 3}, randomBytes(12, 30)),
		},
	}
	idx := &Index{WeightMap: map[string]string{}}
	for file, entries := range shards {
		if _, err := WriteFile(context.Background(), filepath.Join(dir, file), map[string]string{"format": "pt"}, entries, nil); err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			idx.WeightMap[e.Name] = file
		}
	}
	if err := WriteIndex(filepath.Join(dir, IndexFileName), idx); err != nil {
		t.Fatal(err)
	}
	s, err := OpenSharded(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.Shards) != 2 || filepath.Base(s.Shards[0].Path) != "model-00001-of-00002.safetensors" {
		t.Fatalf("shards not in sorted order: %d", len(s.Shards))
	}
	for file, entries := range shards {
		for _, e := range entries {
			f, ti, ok := s.Lookup(e.Name)
			if !ok || filepath.Base(f.Path) != file || ti.Name != e.Name {
				t.Fatalf("Lookup(%s) = %v, %+v, %v", e.Name, f, ti, ok)
			}
			r, _ := e.Open()
			want := make([]byte, ti.NumBytes())
			r.Read(want)
			if got := readSection(t, f, e.Name); !bytes.Equal(got, want) {
				t.Errorf("tensor %s: data differs", e.Name)
			}
		}
	}
	if _, _, ok := s.Lookup("nope"); ok {
		t.Error("Lookup found a tensor that is not there")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
