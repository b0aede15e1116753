package placement

import (
	"fmt"
	"strings"

	"github.com/moeprep/moeprep/torchbin"
)

// readSGLangPT reads the .pt file SGLang's expert-distribution recorder
// writes in its "stat" mode (python/sglang/srt/eplb/expert_distribution.py,
// _StatAccumulator.dump, at sgl-project/sglang@02295fe5ac5c): torch.save of
// a dict holding "logical_count", an int32 tensor [N][layers][E] (one row
// per buffered forward pass, all ranks summed), next to plain values
// ("rank", "average_utilization_rate_over_window") that are not loads. The
// N passes are summed, as SGLang does when it rebalances from the file; a
// [layers][E] tensor is read as one pass. torchbin reads the pickle without
// running it, so the "per_token" mode's dump (a list of records, no
// logical_count) is refused, as is any other tensor.
func readSGLangPT(path string) (*Stats, error) {
	if err := checkFileSize(path); err != nil {
		return nil, err
	}
	f, err := torchbin.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w (want SGLang's expert-distribution dump: a dict holding logical_count)", err)
	}
	defer f.Close()
	t, ok := f.Lookup("logical_count")
	if !ok {
		return nil, fmt.Errorf("%s: no logical_count tensor (holds %s); want SGLang's expert-distribution dump of the stat mode", path, tensorNames(f))
	}
	if len(f.Tensors) != 1 {
		return nil, fmt.Errorf("%s: holds tensors %s besides logical_count; want SGLang's expert-distribution dump, whose only tensor is logical_count", path, tensorNames(f))
	}
	var passes, layers, experts int64
	switch len(t.Shape) {
	case 2:
		passes, layers, experts = 1, t.Shape[0], t.Shape[1]
	case 3:
		passes, layers, experts = t.Shape[0], t.Shape[1], t.Shape[2]
	default:
		return nil, fmt.Errorf("%s: logical_count has shape %v; want [layers][experts] or [passes][layers][experts]", path, t.Shape)
	}
	if passes < 1 || layers < 1 || layers > maxLayers || experts < 1 || experts > maxExperts {
		return nil, fmt.Errorf("%s: logical_count has shape %v; want 1 to %d layers of 1 to %d experts", path, t.Shape, maxLayers, maxExperts)
	}
	if layers*experts > maxCells {
		return nil, fmt.Errorf("%s: logical_count has shape %v: %d layers × %d experts is over the limit of %d counts", path, t.Shape, layers, experts, maxCells)
	}
	s := &Stats{File: path, Layers: make([]int, layers), Loads: make([][]float64, layers)}
	for l := range s.Loads {
		s.Layers[l] = l
		s.Loads[l] = make([]float64, experts)
	}
	row := experts * int64(t.DType.Size())
	for n := range passes {
		for l := range layers {
			what := fmt.Sprintf("logical_count: layer %d", l)
			if passes > 1 {
				what = fmt.Sprintf("logical_count: pass %d, layer %d", n, l)
			}
			if err := addCounts(t.Data, (n*layers+l)*row, t.DType, s.Loads[l], path, what); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

func tensorNames(f *torchbin.File) string {
	names := make([]string, 0, len(f.Tensors))
	for _, t := range f.Tensors {
		names = append(names, t.Name)
		if len(names) == 8 {
			names = append(names, "...")
			break
		}
	}
	if len(names) == 0 {
		return "no tensor"
	}
	return strings.Join(names, ", ")
}
