package torchbin

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/moeprep/moeprep/internal/safeio"
	"github.com/moeprep/moeprep/safetensors"
)

// Index is pytorch_model.bin.index.json: tensor name -> shard file name,
// read with the same strict rules as model.safetensors.index.json.
type Index = safetensors.Index

// ReadIndex reads and checks an index file: a JSON object without duplicate
// keys whose weight_map is a non-empty object of tensor name to shard base
// name ending in .bin, .pt or .pth (no directories, so an index cannot point
// outside its folder).
func ReadIndex(path string) (*Index, error) {
	return safetensors.ReadIndexFor(path, ".bin", ".pt", ".pth")
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
	names := slices.Sorted(maps.Keys(idx.WeightMap))
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
func (s *Sharded) Close() error { return safeio.CloseAll(s.Shards) }
