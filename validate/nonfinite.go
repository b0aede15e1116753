package validate

import (
	"errors"
	"github.com/moeprep/moeprep/validate/judge"
	"github.com/moeprep/moeprep/validate/tensorbytes"
	"math"
)

// nonFiniteRows turns a path's error into the layer's failing non-finite
// row when a weight held a NaN or Inf (err keeps the layer and expert the
// paths wrapped around it); any other error is returned as it is.
func nonFiniteRows(tg target, t int, err error) ([]LayerResult, error) {
	var nf *tensorbytes.NonFiniteError
	if !errors.As(err, &nf) {
		return nil, err
	}
	return []LayerResult{nonFiniteRow(tg, t, err)}, nil
}

func nonFiniteRow(tg target, t int, err error) LayerResult {
	r := LayerResult{Layer: tg.index, MTP: tg.mtp, Bank: tg.bank.String(), Check: judge.NonFinite, Tokens: t, Reason: err.Error()}
	r.Diff = judge.Diff{RelL2: nanF, MaxAbs: nanF, Cosine: nanF, Problem: "non-finite weights"}
	r.TopK, r.TopKWeightMaxErr = nanF, nanF
	return r
}

var nanF = math.NaN()
