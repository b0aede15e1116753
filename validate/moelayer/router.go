package moelayer

import (
	"fmt"
	"math"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// RouterScale reads the router's scale tensor (Inkling's global_scale), a
// finite non-zero scalar (zero would make the whole layer's output zero,
// nothing to compare); 1 when the router has none.
func RouterScale(src tensorload.TensorSource, rr RouterRef) (float32, error) {
	if rr.Scale == "" {
		return 1, nil
	}
	s, err := tensorload.LoadVector(src, rr.Scale, 1)
	if err != nil {
		return 0, err
	}
	if v := float64(s[0]); math.IsNaN(v) || math.IsInf(v, 0) || v == 0 {
		file := ""
		if t, ok := src.Tensor(rr.Scale); ok {
			file = t.File + ": "
		}
		return 0, fmt.Errorf("%srouter scale %s is %v: want a finite, non-zero scalar", file, rr.Scale, v)
	}
	return s[0], nil
}

// RouterOf names a planned layer's router.
func RouterOf(l *family.Layer) RouterRef {
	return RouterRef{Router: l.Router, Bias: l.RouterBias, LogitBias: l.RouterLogitBias, Hash: l.HashTable, Scale: l.RouterScale, ExpertScale: l.ExpertScale}
}
