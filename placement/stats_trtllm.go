package placement

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"github.com/moeprep/moeprep/safetensors"
)

// maxRankFiles bounds the files of a TensorRT-LLM statistics directory:
// one per rank, and no deployment has more ranks than this.
const maxRankFiles = 1024

// rankFile and recordKey are the names TensorRT-LLM's ExpertStatistic
// writes: rank<R>.safetensors per rank, keyed "<iteration>_<layer>".
var (
	rankFile  = regexp.MustCompile(`^rank(0|[1-9][0-9]{0,5})\.safetensors$`)
	recordKey = regexp.MustCompile(`^(0|[1-9][0-9]{0,8})_(0|[1-9][0-9]{0,5})$`)
)

// readTRTLLM reads the directory TensorRT-LLM's expert statistic writes
// when EXPERT_STATISTIC_ITER_RANGE and EXPERT_STATISTIC_PATH are set
// (tensorrt_llm/_torch/expert_statistic.py at
// NVIDIA/TensorRT-LLM@0fccc5b97dd7): meta_info.json ({"num_experts",
// "num_experts_per_token"}, from rank 0) and, per rank R,
// rankR.safetensors, one tensor per recorded iteration and layer named
// "<iteration>_<layer>", holding that rank's routed-token count per expert
// ([E], torch.bincount's int64). The loads are aggregated as the engine's
// examples/ep_load_balancer (utils.py load_expert_statistic@9546c992836a,
// generate_eplb_config.py@195a8bdc437a) does: every rank's tensor of a key
// summed, then each layer's iterations summed; the iterations must be
// contiguous and every layer recorded at every one of them, which the
// example asserts too. Other files (cooccurrence_rank*.safetensors,
// rank*_numtokens.json) carry no per-expert loads and are not read.
func readTRTLLM(dir string) (*Stats, error) {
	metaPath := filepath.Join(dir, "meta_info.json")
	b, err := readBounded(metaPath, "statistics")
	if err != nil {
		return nil, fmt.Errorf("%s: want TensorRT-LLM's expert statistic directory (meta_info.json and rank*.safetensors): %w", dir, err)
	}
	var meta struct {
		NumExperts *int64 `json:"num_experts"`
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("%s: not TensorRT-LLM's meta_info: %v", metaPath, err)
	}
	if meta.NumExperts == nil || *meta.NumExperts < 1 || *meta.NumExperts > maxExperts {
		return nil, fmt.Errorf("%s: num_experts missing or not 1 to %d", metaPath, maxExperts)
	}
	E := int(*meta.NumExperts)

	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range ents {
		if rankFile.MatchString(e.Name()) {
			files = append(files, e.Name())
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no rank*.safetensors beside meta_info.json", dir)
	}
	if len(files) > maxRankFiles {
		return nil, fmt.Errorf("%s: %d rank files, over the limit of %d", dir, len(files), maxRankFiles)
	}

	type key struct{ iter, layer int }
	seen := map[key]bool{}
	loads := map[int][]float64{}
	for _, name := range files {
		path := filepath.Join(dir, name)
		if err := checkFileSize(path); err != nil {
			return nil, err
		}
		f, err := safetensors.Open(path)
		if err != nil {
			return nil, err
		}
		err = func() error {
			defer f.Close()
			for _, t := range f.Tensors {
				m := recordKey.FindStringSubmatch(t.Name)
				if m == nil {
					return fmt.Errorf("%s: tensor %q is not named <iteration>_<layer>", path, t.Name)
				}
				it, _ := strconv.Atoi(m[1])
				l, _ := strconv.Atoi(m[2])
				what := fmt.Sprintf("layer %d, iteration %d", l, it)
				if len(t.Shape) != 1 || t.Shape[0] != int64(E) {
					return fmt.Errorf("%s: %s: shape %v; want [%d] (num_experts in meta_info.json)", path, what, t.Shape, E)
				}
				row, ok := loads[l]
				if !ok {
					if len(loads) == maxLayers || (len(loads)+1)*E > maxCells {
						return fmt.Errorf("%s: layer %d: over %d layers of %d experts recorded; moeprep reads up to %d layers and %d counts", path, l, len(loads), E, maxLayers, maxCells)
					}
					row = make([]float64, E)
					loads[l] = row
				}
				if !seen[key{it, l}] && len(seen) == maxRecords {
					return fmt.Errorf("%s: over %d (iteration, layer) records in the rank files", path, maxRecords)
				}
				seen[key{it, l}] = true
				sec, err := f.SectionOf(t)
				if err != nil {
					return fmt.Errorf("%s: %s: %v", path, what, err)
				}
				if err := addCounts(sec, 0, t.DType, row, path, what); err != nil {
					return err
				}
			}
			return nil
		}()
		if err != nil {
			return nil, err
		}
	}
	if len(seen) == 0 {
		return nil, fmt.Errorf("%s: no iteration recorded in the rank files", dir)
	}
	var iters, layers []int
	for k := range seen {
		iters = append(iters, k.iter)
	}
	for l := range loads {
		layers = append(layers, l)
	}
	slices.Sort(iters)
	iters = slices.Compact(iters)
	slices.Sort(layers)
	if iters[len(iters)-1]-iters[0]+1 != len(iters) {
		return nil, fmt.Errorf("%s: the recorded iterations %d to %d have gaps (%d of them)", dir, iters[0], iters[len(iters)-1], len(iters))
	}
	for _, it := range iters {
		for _, l := range layers {
			if !seen[key{it, l}] {
				return nil, fmt.Errorf("%s: layer %d has no record for iteration %d (every layer must be recorded at iterations %d to %d)", dir, l, it, iters[0], iters[len(iters)-1])
			}
		}
	}
	s := &Stats{File: dir, Layers: layers}
	for _, l := range layers {
		s.Loads = append(s.Loads, loads[l])
	}
	return s, nil
}
