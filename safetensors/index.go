package safetensors

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
	"unicode/utf8"
)

// maxIndexSize bounds what ReadIndex loads; real indexes are a few MB.
const maxIndexSize = 1 << 30

// ReadIndex reads and checks an index file: a JSON object whose weight_map
// maps tensor names to plain shard file names ending in .safetensors.
// Duplicate keys are refused; metadata is optional; other top-level keys are
// ignored, as transformers does. Every error names path.
func ReadIndex(path string) (*Index, error) { return ReadIndexFor(path, ".safetensors") }

// ReadIndexFor is ReadIndex for an index whose shards end in one of
// shardSuffixes (pytorch_model.bin.index.json names .bin shards): the same
// strict JSON rules for every sharded format.
func ReadIndexFor(path string, shardSuffixes ...string) (*Index, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxIndexSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxIndexSize {
		return nil, fmt.Errorf("%s: index is over %d bytes", path, maxIndexSize)
	}
	idx, err := parseIndex(data, shardSuffixes...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return idx, nil
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

// parseIndex is ReadIndexFor without the file system; with no suffixes given
// shards must end in .safetensors.
func parseIndex(data []byte, shardSuffixes ...string) (*Index, error) {
	if len(shardSuffixes) == 0 {
		shardSuffixes = []string{".safetensors"}
	}
	if !utf8.Valid(data) {
		return nil, errors.New("index is not valid UTF-8")
	}
	p := &headerParser{dec: json.NewDecoder(bytes.NewReader(data))}
	p.dec.UseNumber()
	if err := p.openObject("index"); err != nil {
		return nil, err
	}
	idx := &Index{}
	seen := map[string]bool{}
	for {
		k, ok, err := p.key()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if seen[k] {
			return nil, fmt.Errorf("duplicate key %q in index", k)
		}
		seen[k] = true
		switch k {
		case "weight_map":
			if idx.WeightMap, err = p.weightMap(shardSuffixes); err != nil {
				return nil, err
			}
		case "metadata":
			var m map[string]any
			if err := p.dec.Decode(&m); err != nil {
				return nil, fmt.Errorf("metadata is not a JSON object: %w", err)
			}
			idx.Metadata = m
		default:
			var skip json.RawMessage
			if err := p.dec.Decode(&skip); err != nil {
				return nil, fmt.Errorf("index is not valid JSON: %w", err)
			}
		}
	}
	if _, err := p.dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("index has trailing data after the JSON object")
	}
	if idx.WeightMap == nil {
		return nil, errors.New("index has no weight_map")
	}
	if len(idx.WeightMap) == 0 {
		return nil, errors.New("index weight_map is empty")
	}
	return idx, nil
}

// weightMap reads an object of tensor name to shard file name.
func (p *headerParser) weightMap(shardSuffixes []string) (map[string]string, error) {
	if err := p.openObject("weight_map"); err != nil {
		return nil, err
	}
	wm := map[string]string{}
	for {
		k, ok, err := p.key()
		if err != nil {
			return nil, err
		}
		if !ok {
			return wm, nil
		}
		if _, dup := wm[k]; dup {
			return nil, fmt.Errorf("weight_map: tensor %q listed twice", k)
		}
		tok, err := p.token()
		if err != nil {
			return nil, err
		}
		file, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("weight_map: tensor %q maps to %s, not a file name", k, describe(tok))
		}
		if err := checkShardName(file, shardSuffixes...); err != nil {
			return nil, fmt.Errorf("weight_map: tensor %q: %w", k, err)
		}
		wm[k] = file
	}
}

// checkShardName refuses anything but a plain file name in the index's own
// directory, so an index cannot point outside it.
func checkShardName(name string, suffixes ...string) error {
	if len(suffixes) == 0 {
		suffixes = []string{".safetensors"}
	}
	switch {
	case strings.ContainsAny(name, `/\`) || strings.ContainsRune(name, 0):
		return fmt.Errorf("shard name %q is not a plain file name", name)
	case strings.Contains(name, ".."):
		return fmt.Errorf("shard name %q contains \"..\"", name)
	}
	for _, s := range suffixes {
		if strings.HasSuffix(name, s) && name != s {
			return nil
		}
	}
	return fmt.Errorf("shard name %q does not end in %s", name, strings.Join(suffixes, " or "))
}

// WriteIndex writes idx atomically (temporary name, sync, rename) as
// transformers does: keys sorted, two-space indent, trailing newline.
func WriteIndex(path string, idx *Index) error {
	b, err := EncodeIndex(idx)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return writeFileAtomic(path, b)
}

// EncodeIndex is the JSON WriteIndex writes, for callers that write and sync
// the file themselves.
func EncodeIndex(idx *Index) ([]byte, error) {
	if idx == nil || len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("index has an empty weight_map")
	}
	for name, file := range idx.WeightMap {
		if err := checkShardName(file); err != nil {
			return nil, fmt.Errorf("weight_map: tensor %q: %w", name, err)
		}
	}
	out := *idx
	if out.Metadata == nil {
		out.Metadata = map[string]any{}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&out); err != nil { // struct fields are already in sorted order
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeFileAtomic writes a small file to path+".tmp", syncs it and renames it.
func writeFileAtomic(path string, data []byte) (err error) {
	tmp := path + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return diskError(err)
	}
	defer func() {
		if err != nil {
			out.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := out.Write(data); err != nil {
		return diskError(err)
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("%s: sync: %w", tmp, diskError(err))
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("%s: close: %w", tmp, diskError(err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	syncDir(filepath.Dir(path))
	return nil
}

// OpenSharded opens dir/model.safetensors.index.json and every shard it names,
// and checks the index and the shards agree both ways: every weight_map entry
// is in its shard, and every shard tensor is in the map, mapped to that shard.
func OpenSharded(dir string) (_ *Sharded, err error) {
	indexPath := filepath.Join(dir, IndexFileName)
	idx, err := ReadIndex(indexPath)
	if err != nil {
		return nil, err
	}
	s := &Sharded{Dir: dir, Index: idx}
	defer func() {
		if err != nil {
			s.Close() // the opening error is the one to report
		}
	}()
	byFile := map[string]*File{}
	for _, name := range shardNames(idx) {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: shard %s named in the weight_map is missing", indexPath, name)
		}
		f, err := Open(path)
		if err != nil {
			return nil, err
		}
		s.Shards = append(s.Shards, f)
		byFile[name] = f
	}
	names := make([]string, 0, len(idx.WeightMap))
	for name := range idx.WeightMap {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		file := idx.WeightMap[name]
		if _, ok := byFile[file].Lookup(name); !ok {
			return nil, fmt.Errorf("%s: tensor %q is in the weight_map of %s but not in the shard", byFile[file].Path, name, IndexFileName)
		}
	}
	for _, f := range s.Shards {
		file := filepath.Base(f.Path)
		for _, t := range f.Tensors {
			mapped, ok := idx.WeightMap[t.Name]
			if !ok {
				return nil, fmt.Errorf("%s: tensor %q is missing from the weight_map of %s", f.Path, t.Name, IndexFileName)
			}
			if mapped != file {
				return nil, fmt.Errorf("%s: tensor %q is mapped to %s in %s", f.Path, t.Name, mapped, IndexFileName)
			}
		}
	}
	return s, nil
}

// shardNames lists the weight_map's files, sorted and deduplicated.
func shardNames(idx *Index) []string {
	set := map[string]bool{}
	for _, file := range idx.WeightMap {
		set[file] = true
	}
	names := make([]string, 0, len(set))
	for file := range set {
		names = append(names, file)
	}
	sort.Strings(names)
	return names
}

// Lookup finds the shard holding a tensor, following the weight_map.
func (s *Sharded) Lookup(name string) (*File, TensorInfo, bool) {
	file, ok := s.Index.WeightMap[name]
	if !ok {
		return nil, TensorInfo{}, false
	}
	for _, f := range s.Shards {
		if filepath.Base(f.Path) == file {
			t, ok := f.Lookup(name)
			return f, t, ok
		}
	}
	return nil, TensorInfo{}, false
}

// Close closes every shard and reports the first error.
func (s *Sharded) Close() error {
	var first error
	for _, f := range s.Shards {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
