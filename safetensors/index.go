package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/moeprep/moeprep/internal/safeio"
)

// maxIndexSize bounds an index file, checked before anything is read. Real
// indexes are a few MB even for the largest models (DeepSeek-V3's, 91,000
// tensors, is about 9 MB; Kimi-K2 INT4's, 211,000, about 20 MB); 64 MiB
// leaves three times the largest, and a hostile (say sparse) file of a GB
// costs nothing.
const maxIndexSize = 64 << 20

// MaxIndexTensors bounds the tensors an index may list: a sharded
// checkpoint's whole count. Kimi-K2 stored as INT4 (three tensors a
// projection, 61 layers of 384 experts) has about 211,000, the most of any
// checkpoint we know; each entry costs about 150 bytes here, so 1 Mi keeps a
// hostile index to about 150 MB while leaving real ones five times the room.
const MaxIndexTensors = 1 << 20

// maxShards bounds the distinct shard files an index may name, all of which
// OpenSharded holds open at once. DeepSeek-V3 has 163 and Kimi-K2 64; even a
// 2 TB checkpoint cut into 1 GB shards has 2,000.
const maxShards = 1 << 14

// maxIndexKeys bounds an index's top-level keys: real ones have two
// (metadata and weight_map), and each is remembered to refuse duplicates.
const maxIndexKeys = 1 << 10

// maxIndexMetadata bounds the bytes of an index's metadata object, which is
// decoded into Go values: real ones are {"total_size": N}, a few add
// total_parameters.
const maxIndexMetadata = 1 << 20

// ReadIndex reads and checks an index file: a JSON object whose weight_map
// maps tensor names to plain shard file names ending in .safetensors.
// Duplicate keys are refused; metadata is optional; other top-level keys are
// ignored, as transformers does. Every error names path.
func ReadIndex(path string) (*Index, error) { return ReadIndexFor(path, ".safetensors") }

// ReadIndexFor is ReadIndex for an index whose shards end in one of
// shardSuffixes (pytorch_model.bin.index.json names .bin shards): the same
// strict JSON rules and limits for every sharded format. Anything but a
// regular file (a named pipe would block forever) is refused, and the size
// is checked before anything is read.
func ReadIndexFor(path string, shardSuffixes ...string) (*Index, error) {
	data, err := safeio.ReadFile(path, maxIndexSize, filepath.Base(path))
	if err != nil {
		return nil, err
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
	p := &headerParser{s: scanner{b: data, what: "index"}}
	s := &p.s
	if err := s.notEmpty("index"); err != nil {
		return nil, err
	}
	// The whole index is checked to be well formed first, building nothing.
	keys, err := s.enter("index", "", maxIndexKeys, "index has %d top-level keys, over the limit of %d (real ones have metadata and weight_map)")
	if err != nil {
		return nil, err
	}
	idx := &Index{}
	seen := make(map[string]bool, keys)
	for first := true; ; first = false {
		k, ok, err := p.key(first)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if seen[string(k)] {
			return nil, fmt.Errorf("duplicate key %q in index", k)
		}
		seen[string(k)] = true
		switch string(k) {
		case "weight_map":
			if idx.WeightMap, err = p.weightMap(shardSuffixes); err != nil {
				return nil, err
			}
		case "metadata":
			if idx.Metadata, err = p.indexMetadata(); err != nil {
				return nil, err
			}
		default:
			if err := s.skipValue(2); err != nil {
				return nil, err
			}
		}
	}
	if err := s.trailing(); err != nil {
		return nil, err
	}
	if idx.WeightMap == nil {
		return nil, errors.New("index has no weight_map")
	}
	if len(idx.WeightMap) == 0 {
		return nil, errors.New("index weight_map is empty")
	}
	return idx, nil
}

// indexMetadata reads the index's metadata: an object of any values (null:
// none), numbers kept exact as json.Number.
func (p *headerParser) indexMetadata() (map[string]any, error) {
	if null, err := p.s.isNull(); null || err != nil {
		return nil, err
	}
	if err := p.s.atObject("metadata"); err != nil {
		return nil, err
	}
	start := p.s.i
	if err := p.s.skipValue(2); err != nil {
		return nil, err
	}
	raw := p.s.b[start:p.s.i]
	if len(raw) > maxIndexMetadata {
		return nil, fmt.Errorf("metadata is %d bytes, over the limit of %d (real ones hold total_size)", len(raw), maxIndexMetadata)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil { // checked well formed above: cannot fail
		return nil, errors.New("metadata is not a JSON object")
	}
	return m, nil
}

// weightMap reads an object of tensor name to shard file name. It is
// counted before anything is built, and each shard name is checked and
// stored once however many tensors share it.
func (p *headerParser) weightMap(shardSuffixes []string) (map[string]string, error) {
	s := &p.s
	n, err := s.enter("weight_map", "", MaxIndexTensors, "weight_map lists %d tensors, over the limit of %d for one checkpoint (the largest real ones have about 211,000)")
	if err != nil {
		return nil, err
	}
	wm := make(map[string]string, n)
	shards := map[string]string{}
	err = p.stringMembers(func(k string) error {
		if _, dup := wm[k]; dup {
			return fmt.Errorf("weight_map: tensor %q listed twice", k)
		}
		return nil
	}, func(k, kind string) error {
		return fmt.Errorf("weight_map: tensor %q maps to %s, not a file name", k, kind)
	}, func(k string, fb []byte) error {
		file, known := shards[string(fb)]
		if !known {
			file = string(fb)
			if err := checkShardName(file, shardSuffixes...); err != nil {
				return fmt.Errorf("weight_map: tensor %q: %w", k, err)
			}
			if len(shards) == maxShards {
				return fmt.Errorf("weight_map names more than %d shard files, the limit (real checkpoints have tens to hundreds)", maxShards)
			}
			shards[file] = file
		}
		wm[k] = file
		return nil
	})
	if err != nil {
		return nil, err
	}
	return wm, nil
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
	for _, name := range idx.Shards() {
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
		// Checked as each shard opens, so that what the shards hold in all
		// stays within the weight_map's bounds: shards full of tensors the
		// index does not list are refused before the next one is opened.
		for _, t := range f.Tensors {
			mapped, ok := idx.WeightMap[t.Name]
			if !ok {
				return nil, fmt.Errorf("%s: tensor %q is missing from the weight_map of %s", f.Path, t.Name, IndexFileName)
			}
			if mapped != name {
				return nil, fmt.Errorf("%s: tensor %q is mapped to %s in %s", f.Path, t.Name, mapped, IndexFileName)
			}
		}
	}
	// Every shard tensor is a distinct weight_map key mapped to its shard
	// (checked above; a shard's names are unique), so when the counts agree
	// every key is in its shard. Only when they do not is the first key
	// missing from its shard looked for, in name order.
	held := 0
	for _, f := range s.Shards {
		held += len(f.Tensors)
	}
	if held == len(idx.WeightMap) {
		return s, nil
	}
	names := slices.Sorted(maps.Keys(idx.WeightMap))
	for _, name := range names {
		file := idx.WeightMap[name]
		if _, ok := byFile[file].Lookup(name); !ok {
			return nil, fmt.Errorf("%s: tensor %q is in the weight_map of %s but not in the shard", byFile[file].Path, name, IndexFileName)
		}
	}
	return s, nil
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
func (s *Sharded) Close() error { return safeio.CloseAll(s.Shards) }
