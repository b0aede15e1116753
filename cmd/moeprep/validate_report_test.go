package main

import (
	"encoding/json"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// reportGolden is rewritten with -update (golden_test.go's flag):
// go test ./cmd/moeprep -run JSONGolden -update
const reportGolden = "testdata/validate-report.golden.json"

// TestValidateJSONGolden pins the JSON report (schema moeprep.validate/v1,
// validate/SCHEMA.md) of a deterministic run: the HF DeepSeek-V3 bf16
// fixture fused with --tp 2, one of its two MoE layers sampled, four
// experts a layer. Only what differs between runs and machines is
// normalised: times, paths, the version, and the last bits of the measured
// errors (summation order and FMA differ between CPUs), which must stay
// within their tolerance.
func TestValidateJSONGolden(t *testing.T) {
	// DST's config.json records the converting tool's version: pinned, so
	// that DST's bytes, which the report counts, are the same everywhere.
	old := version
	version = "v0.0.0-golden"
	t.Cleanup(func() { version = old })
	src, dst := fusedFixture(t)
	code, stdout, stderr := runCLI(t, "validate", "-q", "--json", "--device", "cpu", "--layers", "sample:1", "--sample-experts", "4",
		"--tokens", "16", "--seed", "3", src, dst)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.HasPrefix(stdout, "{\n  \"schema\": \"moeprep.validate/v1\",\n") {
		t.Fatalf("the report does not start with its schema: %.60q", stdout)
	}
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.UseNumber()
	doc, err := decodeOrdered(dec)
	if err != nil {
		t.Fatal(err)
	}
	got := normaliseReport(t, doc, map[string]string{src: "[SRC]", dst: "[DST]"})
	checkGolden(t, reportGolden, got, "say so in SCHEMA.md")
}

// measured are the fields whose last bits depend on summation order; the
// golden keeps whether they are -1 (not measured), 0, or a number within
// the row's tolerance.
var measured = map[string]bool{"rel_l2": true, "max_abs": true, "cos": true, "ref_norm": true, "worst_token_rel_l2": true, "topk_weight_max_err": true}

var runTime = regexp.MustCompile(`in (\d+(\.\d+)? s|\d+m\d+s|\d+h\d+m)`)

// normaliseReport replaces the report's volatile values with placeholders.
func normaliseReport(t *testing.T, v any, paths map[string]string) any {
	t.Helper()
	switch x := v.(type) {
	case object:
		out := object{}
		var maxRel float64
		for _, f := range x {
			if tol, ok := f.val.(object); ok && f.key == "tolerance" {
				for _, tf := range tol {
					if tf.key == "max_rel_l2" {
						maxRel, _ = tf.val.(json.Number).Float64()
					}
				}
			}
		}
		for _, f := range x {
			k, val := f.key, f.val
			var nv any
			switch {
			case k == "seconds" || strings.HasSuffix(k, "_seconds"):
				nv = "[seconds]"
			case k == "tool":
				nv = "[tool]"
			case k == "timings":
				nv = "[timings]"
			case measured[k]:
				f, err := val.(json.Number).Float64()
				switch {
				case err != nil:
					t.Errorf("%s: %v", k, val)
				case f == -1 || f == 0:
					nv = val
				case (k == "rel_l2" || k == "worst_token_rel_l2") && f > maxRel:
					nv = "[above the tolerance]"
				case k == "cos" && math.Abs(1-f) > 1e-6:
					nv = "[far from 1]"
				default:
					nv = "[measured]"
				}
			default:
				nv = normaliseReport(t, val, paths)
			}
			out = append(out, field{k, nv})
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normaliseReport(t, x[i], paths)
		}
		return out
	case string:
		for p, name := range paths {
			x = strings.ReplaceAll(x, p, name)
		}
		return runTime.ReplaceAllString(x, "in [time]")
	}
	return v
}

// lineDiff shows the lines where two texts first part.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return "line " + strconv.Itoa(i+1) + ":\n want " + a + "\n  got " + b
		}
	}
	return "(no line differs)"
}

// object is a JSON object with its fields in their order, so that the
// golden file reads as the report does.
type object []field

type field struct {
	key string
	val any
}

func (o object) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, f := range o {
		if i > 0 {
			b = append(b, ',')
		}
		k, err := json.Marshal(f.key)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(f.val)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, k...), ':'), v...)
	}
	return append(b, '}'), nil
}

// decodeOrdered reads one JSON value, objects as object, numbers as
// json.Number.
func decodeOrdered(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		o := object{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			o = append(o, field{k.(string), v})
		}
		_, err := dec.Token()
		return o, err
	case json.Delim('['):
		a := []any{}
		for dec.More() {
			v, err := decodeOrdered(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.Token()
		return a, err
	}
	return tok, nil
}
