// The --layers parser and the order and spelling of MoE layer indices.

package validate

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/moeprep/moeprep/family"
)

// selectLayers applies a --layers spec to the sorted MoE layer indices;
// explicit is true for a list (every listed layer must exist).
func selectLayers(spec string, all []int) ([]int, bool, error) {
	spec = strings.TrimSpace(spec)
	switch {
	case spec == "all":
		return all, false, nil
	case strings.HasPrefix(spec, "sample:"):
		n, err := strconv.Atoi(strings.TrimPrefix(spec, "sample:"))
		if err != nil || n <= 0 {
			return nil, false, fmt.Errorf("--layers %q: want sample:N with N > 0", spec)
		}
		// N decoder layers: a layer of two routed banks (ERNIE-4.5-VL)
		// is sampled whole.
		decoders := slices.DeleteFunc(slices.Clone(all), func(i int) bool { return secondBank(i) })
		if n >= len(decoders) {
			return all, false, nil
		}
		// Evenly spaced, first and last included, so a sample always covers
		// both ends of the stack (and an MTP layer when there is one).
		var out []int
		for i := range n {
			j := 0
			if n > 1 {
				j = int(math.Round(float64(i) * float64(len(decoders)-1) / float64(n-1)))
			}
			out = append(out, decoders[j])
		}
		out = slices.Compact(out)
		for _, i := range all {
			if secondBank(i) && slices.Contains(out, decoderOf(i)) {
				out = append(out, i)
			}
		}
		sortLayers(out)
		return out, false, nil
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 0 {
			return nil, false, fmt.Errorf("--layers %q: want all, sample:N or a comma-separated list of layer indices", spec)
		}
		// A decoder layer of two routed banks (ERNIE-4.5-VL) is both.
		found := false
		for _, i := range all {
			if decoderOf(i) == v {
				found = true
				if !slices.Contains(out, i) {
					out = append(out, i)
				}
			}
		}
		if !found {
			return nil, false, fmt.Errorf("--layers: layer %d is not a MoE layer (MoE layers: %s)", v, layerList(all))
		}
	}
	sortLayers(out)
	return out, true, nil
}

// SelectLayers applies a --layers spec (all, sample:N or a list) to the
// MoE layer indices moeLayers, as a whole-model run does: the per-rank
// recomposition picks its layers with it.
func SelectLayers(spec string, moeLayers []int) ([]int, error) {
	all := slices.Clone(moeLayers)
	sortLayers(all)
	out, _, err := selectLayers(spec, all)
	return out, err
}

// sortLayers orders MoE layer indices by decoder layer, so that the two
// routed banks of one (ERNIE-4.5-VL: L and L+65536, family.Layer.Key) are
// checked one after the other and a streamed pass holds what they share
// (the shared MLP, the correction bias) for both; otherwise by index.
func sortLayers(v []int) {
	slices.SortFunc(v, func(a, b int) int {
		return cmp.Or(cmp.Compare(decoderOf(a), decoderOf(b)), cmp.Compare(a, b))
	})
}

// layerList lists MoE layer indices as --layers takes them: a second
// routed bank is its decoder layer's, listed once.
func layerList(v []int) string {
	var s []int
	for _, x := range v {
		if !secondBank(x) {
			s = append(s, x)
		}
	}
	return intList(s)
}

// decoderOf is the decoder layer of MoE layer i, and secondBank says
// whether i is its decoder layer's second routed bank: i is the index the
// run lists its MoE layers by, family.Layer.Key, the report's form.
func decoderOf(i int) int {
	d, _ := family.SplitLayerKey(i)
	return d
}

func secondBank(i int) bool {
	_, b := family.SplitLayerKey(i)
	return b.Second()
}

func intList(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
