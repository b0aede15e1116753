package placement

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// A placement written by Place, as moeprep's JSON or SGLang's file, reads
// back slot for slot; malformed files are refused naming the file and row.
func TestReadMapRoundTrip(t *testing.T) {
	st := &Stats{File: "loads.json", Layers: []int{1, 3}, Loads: [][]float64{{9, 1, 1, 1, 1, 1, 1, 5}, {1, 1, 1, 1, 1, 1, 7, 1}}}
	res, err := Place(Spec{Experts: 8, Slots: 10, Ranks: 2, Nodes: 1, Groups: 1}, st)
	if err != nil {
		t.Fatal(err)
	}
	var v1, sg bytes.Buffer
	if err := json.NewEncoder(&v1).Encode(res); err != nil {
		t.Fatal(err)
	}
	if err := res.WriteSGLang(&sg); err != nil {
		t.Fatal(err)
	}
	m, err := parseMap("p.json", v1.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if m.Form != Schema || !slices.Equal(m.Layers, []int{1, 3}) || m.Slots() != 10 {
		t.Fatalf("v1: form %s layers %v slots %d", m.Form, m.Layers, m.Slots())
	}
	s, err := parseMap("sg.json", sg.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if s.Form != "sglang" || !slices.Equal(s.Layers, []int{0, 1, 2, 3}) {
		t.Fatalf("sglang: form %s layers %v", s.Form, s.Layers)
	}
	for i, l := range res.Layers {
		a, _ := m.Row(l)
		b, _ := s.Row(l)
		if !slices.Equal(a, res.PhysicalToLogical[i]) || !slices.Equal(b, res.PhysicalToLogical[i]) {
			t.Errorf("layer %d: v1 %v, sglang %v, placed %v", l, a, b, res.PhysicalToLogical[i])
		}
		if err := CheckRow(a, 8); err != nil {
			t.Error(err)
		}
	}
	if row, _ := s.Row(0); !slices.Equal(row, []int{0, 1, 2, 3, 4, 5, 6, 7, 0, 1}) {
		t.Errorf("sglang's unrecorded layer 0: %v, want the contiguous map", row)
	}
	for _, tc := range []struct{ doc, want string }{
		{`{"logical_count": [[1, 2]]}`, "pass it as --placement"},
		{`{"physical_to_logical_map": [[0, 1], [0]]}`, "layer 1: 1 slots, want the first layer's 2"},
		{`{"physical_to_logical_map": [[0, -1]]}`, "layer 0 slot 1: expert -1"},
		{`{"physical_to_logical_map": []}`, "has 0 layers"},
		{`{"schema": "moeprep.placement/v1", "layers": [1], "physical_to_logical_map": [[0], [1]]}`, "1 layers named, 2 rows"},
		{`{"schema": "moeprep.placement/v1", "layers": [1, 1], "physical_to_logical_map": [[0], [0]]}`, "layer 1: out of range or named twice"},
		{`{"schema": "other/v2"}`, `schema "other/v2"`},
		{`[1, 2]`, "not a placement"},
	} {
		if _, err := parseMap("f.json", []byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "f.json: ") {
			t.Errorf("%s: %v, want an error naming f.json and %q", tc.doc, err, tc.want)
		}
	}
	for _, tc := range []struct {
		row  []int
		want string
	}{
		{[]int{0, 1, 2}, "expert 3 has no slot"},
		{[]int{0, 1, 2, 4}, "slot 3 holds expert 4, the model has 4"},
	} {
		if err := CheckRow(tc.row, 4); err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v, want %q", tc.row, err, tc.want)
		}
	}
}
