package moelayer

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/tensorload"
)

// Hash-routed layers (DeepSeek-V4's hash_moe) choose a token's experts by
// its token id through a table [vocab, k], so they route on (x, token id),
// not x alone. validate gives such a layer token ids with its x: a
// golden's input_ids, or ids drawn with the seed (DrawTokens). Both paths
// look the ids up in their own checkpoint's table, so a table that convert
// damaged would show.

// routerRef names what routes one layer: the router [E,H] (or [E+S,H]),
// its correction bias, its own logit bias (gpt-oss), a hash table and a
// scale tensor (Inkling's global_scale), "" where absent.
type RouterRef struct {
	Router, Bias, LogitBias, Hash, Scale string
	// ExpertScale [E] multiplies each weight by its expert's entry after
	// the top-k (Gemma 4's per_expert_scale), "" if none.
	ExpertScale string
}

// DrawTokens returns t token ids in [0, vocab) for a hash-routed layer,
// from a PCG stream seeded by (seed, layer) apart from DrawX's.
func DrawTokens(seed uint64, layer, t, vocab int) []int32 {
	r := rand.New(rand.NewPCG(seed^0x746f6b656e73, uint64(layer)))
	out := make([]int32, t)
	for i := range out {
		out[i] = int32(r.IntN(vocab))
	}
	return out
}

// HashVocab is the number of token ids a layer's table maps.
func HashVocab(src tensorload.TensorSource, name string, k int) (int, error) {
	t, ok := src.Tensor(name)
	if !ok {
		return 0, fmt.Errorf("hash routing table %s is missing", name)
	}
	if len(t.Shape) != 2 || t.Shape[0] <= 0 || t.Shape[0] > 1<<31-1 || t.Shape[1] != int64(k) {
		return 0, fmt.Errorf("%s: hash routing table %s has shape %v, want [vocab,%d]", t.File, name, t.Shape, k)
	}
	if t.DType != safetensors.I64 && t.DType != safetensors.I32 {
		return 0, fmt.Errorf("%s: hash routing table %s is %s, want I64 or I32", t.File, name, t.DType)
	}
	return int(t.Shape[0]), nil
}

// hashIDs looks tokens up in a table [vocab, k] of expert ids below e: one
// read of k entries per token, so the table is never loaded whole.
func HashIDs(src tensorload.TensorSource, name string, tokens []int32, k, e int) ([]int32, error) {
	vocab, err := HashVocab(src, name, k)
	if err != nil {
		return nil, err
	}
	if tokens == nil {
		return nil, fmt.Errorf("hash routing table %s: the layer routes by token id and no token ids were given", name)
	}
	t, _ := src.Tensor(name)
	out := make([]int32, len(tokens)*k)
	for i, tok := range tokens {
		if tok < 0 || int(tok) >= vocab {
			return nil, fmt.Errorf("%s: token %d has id %d, outside the %d rows of %s", t.File, i, tok, vocab, name)
		}
		raw, err := tensorload.ReadElems(t, int64(tok)*int64(k), int64(k))
		if err != nil {
			return nil, err
		}
		for j := range k {
			var v int64
			if t.DType == safetensors.I64 {
				v = int64(binary.LittleEndian.Uint64(raw[8*j:]))
			} else {
				v = int64(int32(binary.LittleEndian.Uint32(raw[4*j:])))
			}
			if v < 0 || v >= int64(e) {
				return nil, fmt.Errorf("%s: %s[%d][%d] = %d is not an expert id (the layer has %d)", t.File, name, tok, j, v, e)
			}
			out[i*k+j] = int32(v)
		}
	}
	return out, nil
}
