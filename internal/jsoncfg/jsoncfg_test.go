package jsoncfg

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// Each read checks the value's type and range and names the key with the
// path of its object; null reads as absent.
func TestReads(t *testing.T) {
	var raw map[string]any
	if err := json.Unmarshal([]byte(`{"q": {"n": 1.5, "s": 3, "b": "yes", "big": 9007199254740994, "null": null,
		"l": [1, -2], "ss": ["a", 1], "o": [], "f": "x", "ok": 7}}`), &raw); err != nil {
		t.Fatal(err)
	}
	q, ok, err := Object{M: raw}.Object("q")
	if !ok || err != nil || q.At != "q." {
		t.Fatalf("object: %v %v %q", ok, err, q.At)
	}
	for _, tc := range []struct {
		name string
		read func() (any, error)
		want string // the error, or the value read
	}{
		{"whole", func() (any, error) { return q.IntIn("ok", 0, 0, 10) }, "7"},
		{"out of range", func() (any, error) { return q.IntIn("ok", 0, 0, 5) }, "config.json: q.ok: 7 is out of range [0, 5]"},
		{"not whole", func() (any, error) { return q.IntIn("n", 0, 0, 5) }, "config.json: q.n: want an integer, got 1.5"},
		{"past 2^53", func() (any, error) { return q.Count("big", 0) }, "config.json: q.big: want an integer, got 9.007199254740994e+15"},
		{"null is absent", func() (any, error) { return q.Str("null", "def") }, "def"},
		{"missing size", func() (any, error) { return q.Size("none") }, "config.json: q.none is missing"},
		{"over the limit", func() (any, error) { return q.SizeAtMost("ok", 4, "real models: 2") }, "config.json: q.ok=7 is over the limit of 4 (real models: 2)"},
		{"string", func() (any, error) { return q.Str("s", "") }, "config.json: q.s: want a string, got 3"},
		{"bool", func() (any, error) { return q.Bool("b", false) }, `config.json: q.b: want true or false, got "yes"`},
		{"float", func() (any, error) { return q.Float("f", 0) }, `config.json: q.f: want a number, got "x"`},
		{"negative in ints", func() (any, error) { return q.Ints("l") }, "config.json: q.l: element 1: want a non-negative integer, got -2"},
		{"strs", func() (any, error) { return q.Strs("ss") }, "config.json: q.ss: element 1: want a string, got 1"},
		{"object", func() (any, error) { o, _, err := q.Object("o"); return o.M, err }, "config.json: q.o: want an object, got a list"},
	} {
		v, err := tc.read()
		got := fmt.Sprint(v)
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
	long := Object{M: map[string]any{"l": make([]any, MaxList+1)}}
	if _, err := long.Strs("l"); err == nil || !strings.HasSuffix(err.Error(), "4097 entries, over the limit of 4096") {
		t.Errorf("long list: %v", err)
	}
	if d := Describe(json.Number("12")); d != "12" {
		t.Errorf("Describe(json.Number) = %q", d)
	}
}
