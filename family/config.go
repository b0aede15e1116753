package family

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// maxDim bounds every size read from config.json, so that products of two
// sizes (S*I, shape checks) cannot overflow.
const maxDim = 1<<31 - 1

// Limits on the config.json numbers that size what moeprep builds or loops
// over: a plan holds every MoE layer's expert names, and the commands
// allocate by these sizes (tokens x hidden_size activations, routing tables
// of a layer's experts). A sparse file can back a tensor of any shape, so
// agreeing with the tensors is not enough. Each is far above any released
// model and keeps a hostile config.json to a one-line error instead of
// gigabytes, or the Go runtime running out of memory.
const (
	// maxLayers: the deepest released models have about 130 decoder
	// layers (Llama-3.1-405B 126, Qwen3-235B-A22B 94, DeepSeek-V3 61).
	maxLayers = 1 << 12
	// maxExperts: Qwen3-Next routes over 512 experts, Kimi-K2 384,
	// DeepSeek-V3 256.
	maxExperts = 1 << 14
	// maxSharedExperts: released models have one to eight.
	maxSharedExperts = 1 << 10
	// maxExpertSlots bounds the experts a plan holds over all its MoE
	// layers: Qwen3-Next's 48 x 512 and Kimi-K2's 60 x 384 are about
	// 24,000; each costs a few hundred bytes of names.
	maxExpertSlots = 1 << 18
	// maxHidden: the widest released models have hidden_size 16,384
	// (Llama-3.1-405B); DeepSeek-V3 and Kimi-K2 7,168.
	maxHidden = 1 << 16
	// maxIntermediate bounds expert and shared MLP widths: Mixtral's
	// experts are 14,336 wide, the widest dense MLPs 53,248.
	maxIntermediate = 1 << 18
	// maxVocab bounds a hash-routing table's rows: vocabularies run to
	// about 256,000 (DeepSeek-V4 129,280).
	maxVocab = 1 << 22
	// maxConfigList bounds the layer lists (mlp_layer_types, moe_layers,
	// mlp_only_layers), which have one entry a layer at most.
	maxConfigList = maxLayers
)

// config is one JSON object of config.json as encoding/json decodes it:
// numbers arrive as float64 (or json.Number under UseNumber), so every read
// checks the type and names the key. at is the path of the object itself
// ("" or "quantization_config.") so nested keys are named in full.
type config struct {
	m  map[string]any
	at string
}

// get returns a key's value. JSON null counts as absent: DeepSeek-V2 configs
// write "n_group": null for "unset".
func (c config) get(key string) (any, bool) {
	v, ok := c.m[key]
	if !ok || v == nil {
		return nil, false
	}
	return v, true
}

func (c config) has(key string) bool {
	_, ok := c.get(key)
	return ok
}

func (c config) errorf(key, format string, args ...any) error {
	return fmt.Errorf("config.json: %s%s: %s", c.at, key, fmt.Sprintf(format, args...))
}

func (c config) missing(key string) error {
	return fmt.Errorf("config.json: %s%s is missing", c.at, key)
}

// describe names a JSON value the way an error message should show it.
func describe(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// asInt converts an integral JSON number. Floats must be whole and within
// 2^53, where float64 is still exact.
func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
			return 0, false
		}
		return int64(x), true
	case json.Number:
		n, err := strconv.ParseInt(string(x), 10, 64)
		if err != nil {
			f, ferr := x.Float64()
			if ferr != nil {
				return 0, false
			}
			return asInt(f)
		}
		return n, true
	case int:
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}

// intIn reads an optional integer in [lo, hi].
func (c config) intIn(key string, def, lo, hi int64) (int, error) {
	v, ok := c.get(key)
	if !ok {
		return int(def), nil
	}
	n, ok := asInt(v)
	if !ok {
		return 0, c.errorf(key, "want an integer, got %s", describe(v))
	}
	if n < lo || n > hi {
		return 0, c.errorf(key, "%d is out of range [%d, %d]", n, lo, hi)
	}
	return int(n), nil
}

// size reads a required positive size.
func (c config) size(key string) (int, error) {
	if !c.has(key) {
		return 0, c.missing(key)
	}
	return c.intIn(key, 0, 1, maxDim)
}

// sizeAtMost reads a required positive size of at most hi; what says what
// real models have, for the error.
func (c config) sizeAtMost(key string, hi int, what string) (int, error) {
	n, err := c.size(key)
	if err == nil && n > hi {
		err = fmt.Errorf("config.json: %s%s=%d is over the limit of %d (%s)", c.at, key, n, hi, what)
	}
	return n, err
}

// count reads an optional non-negative integer.
func (c config) count(key string, def int) (int, error) {
	return c.intIn(key, int64(def), 0, maxDim)
}

// float reads an optional finite number.
func (c config) float(key string, def float64) (float64, error) {
	v, ok := c.get(key)
	if !ok {
		return def, nil
	}
	var f float64
	switch x := v.(type) {
	case float64:
		f = x
	case json.Number:
		var err error
		if f, err = x.Float64(); err != nil {
			return 0, c.errorf(key, "want a number, got %s", describe(v))
		}
	case int:
		f = float64(x)
	case int64:
		f = float64(x)
	default:
		return 0, c.errorf(key, "want a number, got %s", describe(v))
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, c.errorf(key, "want a finite number, got %s", describe(v))
	}
	return f, nil
}

// boolean reads an optional true/false.
func (c config) boolean(key string, def bool) (bool, error) {
	v, ok := c.get(key)
	if !ok {
		return def, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, c.errorf(key, "want true or false, got %s", describe(v))
	}
	return b, nil
}

// str reads an optional string.
func (c config) str(key, def string) (string, error) {
	v, ok := c.get(key)
	if !ok {
		return def, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", c.errorf(key, "want a string, got %s", describe(v))
	}
	return s, nil
}

// ints reads an optional list of integers.
func (c config) ints(key string) ([]int, error) {
	return list(c, key, "integers", "a non-negative integer", func(e any) (int, bool) {
		n, ok := asInt(e)
		return int(n), ok && n >= 0 && n <= maxDim
	})
}

// strs reads an optional list of strings.
func (c config) strs(key string) ([]string, error) {
	return list(c, key, "strings", "a string", func(e any) (string, bool) {
		s, ok := e.(string)
		return s, ok
	})
}

// list reads an optional list of at most maxConfigList elements, each
// converted by elem (false: not what the list holds, named by one).
func list[T any](c config, key, many, one string, elem func(any) (T, bool)) ([]T, error) {
	v, ok := c.get(key)
	if !ok {
		return nil, nil
	}
	l, ok := v.([]any)
	if !ok {
		return nil, c.errorf(key, "want a list of %s, got %s", many, describe(v))
	}
	if len(l) > maxConfigList {
		return nil, c.errorf(key, "%d entries, over the limit of %d", len(l), maxConfigList)
	}
	out := make([]T, len(l))
	for i, e := range l {
		x, ok := elem(e)
		if !ok {
			return nil, c.errorf(key, "element %d: want %s, got %s", i, one, describe(e))
		}
		out[i] = x
	}
	return out, nil
}

// object reads an optional nested object.
func (c config) object(key string) (config, bool, error) {
	v, ok := c.get(key)
	if !ok {
		return config{}, false, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return config{}, false, c.errorf(key, "want an object, got %s", describe(v))
	}
	return config{m: m, at: c.at + key + "."}, true, nil
}
