package placement

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moeprep/moeprep/internal/safeio"
)

// Bounds on a statistics file: real ones are a few MB (61 layers × 384
// experts, perhaps a few hundred snapshots of them).
const (
	maxStatsBytes = 256 << 20
	maxLayers     = 4096
	maxExperts    = 65536
	// A count past 2^53 has lost its units in float64: no recording of
	// routed tokens is that large.
	maxCount = 1 << 53
)

// Stats are recorded expert loads: Loads[i] is layer Layers[i]'s load per
// logical expert (routed tokens).
type Stats struct {
	File   string
	Layers []int
	Loads  [][]float64
}

// ReadStats reads recorded loads, in any of the forms the engines write:
//   - SGLang's expert-distribution dump, JSON: {"logical_count": [layers][E]},
//     or [N][layers][E] (N snapshots, summed), the layers indexed from 0;
//   - the same dump as torch.save writes it (.pt, a zip: readSGLangPT);
//   - TensorRT-LLM's expert statistic directory (meta_info.json and
//     rank*.safetensors: readTRTLLM), the layers as the engine numbered them;
//   - a plain object {"3": [counts...], "4": [...]}, keyed by layer index.
//
// A directory is TensorRT-LLM's; a file opening with a zip signature (or
// named .pt or .pth) is torch's; anything else is JSON. Every count must be
// a number between 0 and 2^53, every layer the same number of experts; an
// error names the file and layer.
func ReadStats(path string) (*Stats, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return readTRTLLM(path)
	}
	if isTorchZip(path) {
		return readSGLangPT(path)
	}
	b, err := readBounded(path, "statistics")
	if err != nil {
		return nil, err
	}
	return parseStats(path, b)
}

// isTorchZip says whether path is a torch.save file: named so, or opening
// with a zip local-file header (JSON cannot start with "PK").
func isTorchZip(path string) bool {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".pt", ".pth":
		return true
	}
	f, err := safeio.Open(path)
	if err != nil {
		return false // readBounded reports it
	}
	defer f.Close()
	var head [4]byte
	n, _ := io.ReadFull(f, head[:])
	return n == 4 && string(head[:]) == "PK\x03\x04"
}

// readBounded reads a JSON file of the kind named (placement or
// statistics) whole, refusing one over maxStatsBytes before it is held in
// memory: both are small documents parsed in one piece.
func readBounded(path, kind string) ([]byte, error) {
	f, err := safeio.Open(path) // a FIFO would block os.Open itself
	if err != nil {
		return nil, err // names the file
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStatsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > maxStatsBytes {
		return nil, fmt.Errorf("%s: over %d MiB; moeprep reads %s files up to that", path, maxStatsBytes>>20, kind)
	}
	return b, nil
}

func parseStats(path string, b []byte) (*Stats, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object: %v", path, err)
	}
	s := &Stats{File: path}
	if raw, ok := top["logical_count"]; ok {
		if err := s.readLogicalCount(raw); err != nil {
			return nil, err
		}
	} else {
		if len(top) > maxLayers {
			return nil, fmt.Errorf("%s: %d layers, over the limit of %d", path, len(top), maxLayers)
		}
		for k, raw := range top {
			l, err := strconv.Atoi(k)
			if err != nil || l < 0 || l >= 1<<20 {
				return nil, fmt.Errorf("%s: key %q is not a layer index (want {\"logical_count\": ...} or {\"layer\": [counts...]})", path, k)
			}
			var row []json.Number
			if err := json.Unmarshal(raw, &row); err != nil {
				return nil, fmt.Errorf("%s: layer %d: want a list of counts: %v", path, l, err)
			}
			loads, err := s.counts(l, row)
			if err != nil {
				return nil, err
			}
			s.Layers = append(s.Layers, l)
			s.Loads = append(s.Loads, loads)
		}
		idx := allExperts(len(s.Layers))
		slices.SortFunc(idx, func(a, b int) int { return s.Layers[a] - s.Layers[b] })
		layers, loads := make([]int, len(idx)), make([][]float64, len(idx))
		for i, j := range idx {
			layers[i], loads[i] = s.Layers[j], s.Loads[j]
		}
		s.Layers, s.Loads = layers, loads
	}
	if len(s.Layers) == 0 {
		return nil, fmt.Errorf("%s: no layer recorded", path)
	}
	for i, row := range s.Loads {
		if len(row) != len(s.Loads[0]) {
			return nil, fmt.Errorf("%s: layer %d has %d experts, layer %d has %d", path, s.Layers[i], len(row), s.Layers[0], len(s.Loads[0]))
		}
	}
	return s, nil
}

// readLogicalCount reads SGLang's [layers][E] or [N][layers][E].
func (s *Stats) readLogicalCount(raw json.RawMessage) error {
	var two [][]json.Number
	if err := json.Unmarshal(raw, &two); err == nil {
		if len(two) > maxLayers {
			return fmt.Errorf("%s: logical_count: %d layers, over the limit of %d", s.File, len(two), maxLayers)
		}
		for l, row := range two {
			loads, err := s.counts(l, row)
			if err != nil {
				return err
			}
			s.Layers = append(s.Layers, l)
			s.Loads = append(s.Loads, loads)
		}
		return nil
	}
	var three [][][]json.Number
	if err := json.Unmarshal(raw, &three); err != nil {
		return fmt.Errorf("%s: logical_count: want [layers][experts] or [snapshots][layers][experts] counts: %v", s.File, err)
	}
	for n, snap := range three {
		if n == 0 {
			if len(snap) > maxLayers {
				return fmt.Errorf("%s: logical_count: %d layers, over the limit of %d", s.File, len(snap), maxLayers)
			}
			s.Loads = make([][]float64, len(snap))
			for l := range snap {
				s.Layers = append(s.Layers, l)
			}
		}
		if len(snap) != len(s.Loads) {
			return fmt.Errorf("%s: logical_count: snapshot %d has %d layers, snapshot 0 has %d", s.File, n, len(snap), len(s.Loads))
		}
		for l, row := range snap {
			loads, err := s.counts(l, row)
			if err != nil {
				return fmt.Errorf("%w (snapshot %d)", err, n)
			}
			if n == 0 {
				s.Loads[l] = loads
				continue
			}
			if len(loads) != len(s.Loads[l]) {
				return fmt.Errorf("%s: logical_count: snapshot %d, layer %d has %d experts, snapshot 0 has %d", s.File, n, l, len(loads), len(s.Loads[l]))
			}
			for e, c := range loads {
				s.Loads[l][e] += c
				if s.Loads[l][e] > maxCount {
					return fmt.Errorf("%s: logical_count: layer %d, expert %d: the snapshots sum past 2^53", s.File, l, e)
				}
			}
		}
	}
	return nil
}

// counts checks one layer's row of counts.
func (s *Stats) counts(layer int, row []json.Number) ([]float64, error) {
	if len(row) == 0 || len(row) > maxExperts {
		return nil, fmt.Errorf("%s: layer %d: %d experts (want 1 to %d)", s.File, layer, len(row), maxExperts)
	}
	out := make([]float64, len(row))
	for e, n := range row {
		v, err := strconv.ParseFloat(string(n), 64)
		if err != nil || math.IsNaN(v) || v < 0 || v > maxCount {
			return nil, fmt.Errorf("%s: layer %d, expert %d: count %s is not a number of tokens (0 to 2^53)", s.File, layer, e, n)
		}
		out[e] = v
	}
	return out, nil
}
