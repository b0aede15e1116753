// Package jsoncfg reads the JSON objects of a checkpoint's config files
// (config.json, hf_quant_config.json) as encoding/json decodes them, every
// read checking the value's type and range and naming the key in full on
// error ("config.json: quantization_config.group_size: ..."). The model
// families (family) and the quantisation descriptions (quantdesc) read
// through it, so both word their errors alike.
package jsoncfg

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// MaxDim bounds every size read, so that products of two sizes (S*I, shape
// checks) cannot overflow.
const MaxDim = 1<<31 - 1

// MaxList bounds the entries of a list read (Ints, Strs): the longest real
// ones have one entry a layer, and the deepest models about 130 layers.
const MaxList = 1 << 12

// Object is one JSON object as encoding/json decodes it: numbers arrive as
// float64 (or json.Number under UseNumber), so every read checks the type
// and names the key. At is the path of the object itself ("" or
// "quantization_config.") so nested keys are named in full. Errors say
// config.json; a reader of another file renames them.
type Object struct {
	M  map[string]any
	At string
}

// Get returns a key's value. JSON null counts as absent: DeepSeek-V2
// configs write "n_group": null for "unset".
func (c Object) Get(key string) (any, bool) {
	v, ok := c.M[key]
	if !ok || v == nil {
		return nil, false
	}
	return v, true
}

// Has reports whether the key holds a value other than null.
func (c Object) Has(key string) bool {
	_, ok := c.Get(key)
	return ok
}

// Errorf is the error about a key's value.
func (c Object) Errorf(key, format string, args ...any) error {
	return fmt.Errorf("config.json: %s%s: %s", c.At, key, fmt.Sprintf(format, args...))
}

// Missing is the error of a required key that is absent.
func (c Object) Missing(key string) error {
	return fmt.Errorf("config.json: %s%s is missing", c.At, key)
}

// Describe names a JSON value the way an error message should show it.
func Describe(v any) string {
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

// AsInt converts an integral JSON number. Floats must be whole and within
// 2^53, where float64 is still exact.
func AsInt(v any) (int64, bool) {
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
			return AsInt(f)
		}
		return n, true
	case int:
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}

// IntIn reads an optional integer in [lo, hi].
func (c Object) IntIn(key string, def, lo, hi int64) (int, error) {
	v, ok := c.Get(key)
	if !ok {
		return int(def), nil
	}
	n, ok := AsInt(v)
	if !ok {
		return 0, c.Errorf(key, "want an integer, got %s", Describe(v))
	}
	if n < lo || n > hi {
		return 0, c.Errorf(key, "%d is out of range [%d, %d]", n, lo, hi)
	}
	return int(n), nil
}

// Size reads a required positive size.
func (c Object) Size(key string) (int, error) {
	if !c.Has(key) {
		return 0, c.Missing(key)
	}
	return c.IntIn(key, 0, 1, MaxDim)
}

// SizeAtMost reads a required positive size of at most hi; what says what
// real models have, for the error.
func (c Object) SizeAtMost(key string, hi int, what string) (int, error) {
	n, err := c.Size(key)
	if err == nil && n > hi {
		err = fmt.Errorf("config.json: %s%s=%d is over the limit of %d (%s)", c.At, key, n, hi, what)
	}
	return n, err
}

// Count reads an optional non-negative integer.
func (c Object) Count(key string, def int) (int, error) {
	return c.IntIn(key, int64(def), 0, MaxDim)
}

// Float reads an optional finite number.
func (c Object) Float(key string, def float64) (float64, error) {
	v, ok := c.Get(key)
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
			return 0, c.Errorf(key, "want a number, got %s", Describe(v))
		}
	case int:
		f = float64(x)
	case int64:
		f = float64(x)
	default:
		return 0, c.Errorf(key, "want a number, got %s", Describe(v))
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, c.Errorf(key, "want a finite number, got %s", Describe(v))
	}
	return f, nil
}

// Bool reads an optional true/false.
func (c Object) Bool(key string, def bool) (bool, error) {
	v, ok := c.Get(key)
	if !ok {
		return def, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, c.Errorf(key, "want true or false, got %s", Describe(v))
	}
	return b, nil
}

// Str reads an optional string.
func (c Object) Str(key, def string) (string, error) {
	v, ok := c.Get(key)
	if !ok {
		return def, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", c.Errorf(key, "want a string, got %s", Describe(v))
	}
	return s, nil
}

// Ints reads an optional list of integers in [0, MaxDim].
func (c Object) Ints(key string) ([]int, error) {
	return list(c, key, "integers", "a non-negative integer", func(e any) (int, bool) {
		n, ok := AsInt(e)
		return int(n), ok && n >= 0 && n <= MaxDim
	})
}

// Strs reads an optional list of strings.
func (c Object) Strs(key string) ([]string, error) {
	return list(c, key, "strings", "a string", func(e any) (string, bool) {
		s, ok := e.(string)
		return s, ok
	})
}

// list reads an optional list of at most MaxList elements, each converted
// by elem (false: not what the list holds, named by one).
func list[T any](c Object, key, many, one string, elem func(any) (T, bool)) ([]T, error) {
	v, ok := c.Get(key)
	if !ok {
		return nil, nil
	}
	l, ok := v.([]any)
	if !ok {
		return nil, c.Errorf(key, "want a list of %s, got %s", many, Describe(v))
	}
	if len(l) > MaxList {
		return nil, c.Errorf(key, "%d entries, over the limit of %d", len(l), MaxList)
	}
	out := make([]T, len(l))
	for i, e := range l {
		x, ok := elem(e)
		if !ok {
			return nil, c.Errorf(key, "element %d: want %s, got %s", i, one, Describe(e))
		}
		out[i] = x
	}
	return out, nil
}

// Object reads an optional nested object.
func (c Object) Object(key string) (Object, bool, error) {
	v, ok := c.Get(key)
	if !ok {
		return Object{}, false, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return Object{}, false, c.Errorf(key, "want an object, got %s", Describe(v))
	}
	return Object{M: m, At: c.At + key + "."}, true, nil
}
