package torchbin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// maxIndexBytes bounds pytorch_model.bin.index.json.
const maxIndexBytes = 64 << 20

// Index is pytorch_model.bin.index.json: tensor name -> shard file name.
type Index struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// Shards lists the distinct shard file names in sorted order.
func (idx *Index) Shards() []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range idx.WeightMap {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// ReadIndex reads and checks an index file: a JSON object without
// duplicate keys whose weight_map is a non-empty object of tensor name to
// shard base name (no directories, so an index cannot point outside its
// folder).
func ReadIndex(path string) (*Index, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxIndexBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > maxIndexBytes {
		return nil, fmt.Errorf("%s: index larger than %d bytes", path, maxIndexBytes)
	}
	idx, err := parseIndex(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return idx, nil
}

func parseIndex(b []byte) (*Index, error) {
	if err := checkDuplicateKeys(b); err != nil {
		return nil, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	idx := &Index{}
	if m, ok := raw["metadata"]; ok && string(m) != "null" {
		if err := json.Unmarshal(m, &idx.Metadata); err != nil {
			return nil, fmt.Errorf("metadata is not an object: %w", err)
		}
	}
	wm, ok := raw["weight_map"]
	if !ok {
		return nil, errors.New("no weight_map")
	}
	if err := json.Unmarshal(wm, &idx.WeightMap); err != nil || idx.WeightMap == nil {
		return nil, errors.New("weight_map is not an object of tensor name to file name")
	}
	if len(idx.WeightMap) == 0 {
		return nil, errors.New("weight_map is empty")
	}
	for name, shard := range idx.WeightMap {
		if name == "" {
			return nil, errors.New("weight_map has an empty tensor name")
		}
		if shard == "" || shard == "." || shard == ".." || strings.ContainsAny(shard, "/\\\x00") {
			return nil, fmt.Errorf("weight_map[%q] = %q is not a plain file name", name, shard)
		}
	}
	return idx, nil
}

// checkDuplicateKeys refuses any JSON object with a repeated key, which
// encoding/json would silently resolve to the last value.
func checkDuplicateKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		keys     map[string]bool // nil for arrays
		needsKey bool
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			if len(stack) != 0 {
				return errors.New("invalid JSON: unexpected end of input")
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("invalid JSON: %w", err)
		}
		top := len(stack) - 1
		if top >= 0 && stack[top].keys != nil && stack[top].needsKey {
			if k, ok := tok.(string); ok {
				if stack[top].keys[k] {
					return fmt.Errorf("duplicate key %q", k)
				}
				stack[top].keys[k] = true
				stack[top].needsKey = false
				continue
			}
		}
		if top >= 0 && stack[top].keys != nil {
			stack[top].needsKey = true // this token is a value (or '}')
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{keys: map[string]bool{}, needsKey: true})
		case json.Delim('['):
			stack = append(stack, frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if n := len(stack) - 1; n >= 0 && stack[n].keys != nil {
				stack[n].needsKey = true
			}
		}
	}
}

// Sharded is an opened sharded torch checkpoint whose index and shards agree
// both ways.
type Sharded struct {
	Dir    string
	Index  *Index
	Shards []*File // in sorted file-name order
}

// OpenSharded opens dir/pytorch_model.bin.index.json and every shard it
// names, and checks that each weight_map entry is in its shard and each
// shard tensor is in the weight_map under that shard.
func OpenSharded(dir string) (*Sharded, error) {
	ipath := filepath.Join(dir, IndexFileName)
	idx, err := ReadIndex(ipath)
	if err != nil {
		return nil, err
	}
	s := &Sharded{Dir: dir, Index: idx}
	for _, name := range idx.Shards() {
		f, err := Open(filepath.Join(dir, name))
		if err != nil {
			s.Close()
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%s: shard %s is missing", ipath, name)
			}
			return nil, err
		}
		s.Shards = append(s.Shards, f)
		for _, t := range f.Tensors {
			if want, ok := idx.WeightMap[t.Name]; !ok || want != name {
				s.Close()
				if !ok {
					return nil, fmt.Errorf("%s: tensor %q is not in %s", f.Path, t.Name, IndexFileName)
				}
				return nil, fmt.Errorf("%s: tensor %q is also in this shard, but %s maps it to %s", f.Path, t.Name, IndexFileName, want)
			}
		}
	}
	byShard := map[string]*File{}
	for _, f := range s.Shards {
		byShard[filepath.Base(f.Path)] = f
	}
	names := make([]string, 0, len(idx.WeightMap))
	for name := range idx.WeightMap {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		shard := idx.WeightMap[name]
		if _, ok := byShard[shard].Lookup(name); !ok {
			s.Close()
			return nil, fmt.Errorf("%s: tensor %q is mapped to %s, which does not hold it", ipath, name, shard)
		}
	}
	return s, nil
}

// Close closes every shard.
func (s *Sharded) Close() error {
	var first error
	for _, f := range s.Shards {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
