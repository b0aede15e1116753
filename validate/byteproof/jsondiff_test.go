package byteproof

import (
	"strings"
	"testing"
)

// TestJSONDiff: decoded JSON compared as a loader reads it.
func TestJSONDiff(t *testing.T) {
	for _, tc := range []struct {
		a, b  string
		kinds bool
		want  string // "": equal
	}{
		{`{"a": 1, "b": [1, 2]}`, `{"b": [1, 2], "a": 1}`, true, ""},
		{`{"x": 1e-05}`, `{"x": 0.00001}`, true, ""},
		{`{"x": 1.50}`, `{"x": 15e-1}`, true, ""},
		{`{"x": 0}`, `{"x": -0}`, true, ""},
		{`{"x": 1e-05}`, `{"x": 1.0000000000000001e-05}`, true, "x is 1e-05 in A, 1.0000000000000001e-05 in B"},
		{`{"x": 1}`, `{"x": 1.0}`, true, "x is 1 in A, 1.0 in B"},
		{`{"x": 1}`, `{"x": 1.0}`, false, ""},
		{`{"x": 1}`, `{"x": "1"}`, true, `x is 1 in A, "1" in B`},
		{`{"x": {"y": [1, {"z": null}]}}`, `{"x": {"y": [1, {"z": false}]}}`, true, "x.y[1].z is null in A, false in B"},
		{`{"x": [1, 2]}`, `{"x": [1]}`, true, "x is [1,2] in A, [1] in B"},
		{`{"a.b": 1}`, `{"a.b": 2}`, true, `"a.b" is 1 in A, 2 in B`},
		{`{"a": 1}`, `{"a": 1, "b\n": 2}`, true, `"b\n" is in B (2), not in A`},
		{`{"x": 1e999999999999}`, `{"x": 1e999999999999}`, true, ""},
		{`{"x": 1e999999999999}`, `{"x": 10e999999999998}`, true, "x is 1e999999999999 in A, 10e999999999998 in B"},
	} {
		a, _, err := decodeJSON([]byte(tc.a))
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := decodeJSON([]byte(tc.b))
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if d := firstJSONDiff(a, b, "", tc.kinds); d != nil {
			got = d.describe("A", "B")
		}
		if got != tc.want {
			t.Errorf("%s vs %s: %q, want %q", tc.a, tc.b, got, tc.want)
		}
	}
	for _, bad := range []string{`{"a": 1} {}`, `{"a": }`, `{"a": 1`, strings.Repeat("[", maxJSONDepth+2) + strings.Repeat("]", maxJSONDepth+2)} {
		if _, _, err := decodeJSON([]byte(bad)); err == nil {
			t.Errorf("%.40s: accepted", bad)
		}
	}
	_, dups, err := decodeJSON([]byte(`{"a": {"b": 1, "b": 2}, "c": 3, "c": 4}`))
	if err != nil || strings.Join(dups, ",") != "a.b,c" {
		t.Errorf("duplicates %v %v", dups, err)
	}
}

// TestPlainRel: the manifest names the proof accepts before opening them.
func TestPlainRel(t *testing.T) {
	for name, want := range map[string]bool{
		"config.json": true, "reference/moe-layer-1.safetensors": true, "a b/c.txt": true,
		"": false, ".": false, "..": false, "../x": false, "a/../../x": false, "a/./b": false, "./a": false,
		"/etc/hostname": false, "a//b": false, "a/": false, "a\x00b": false,
	} {
		if got := plainRel(name); got != want {
			t.Errorf("%q: %v, want %v", name, got, want)
		}
	}
}
