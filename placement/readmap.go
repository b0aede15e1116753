package placement

import (
	"encoding/json"
	"fmt"
)

// Map is a placement read back from a file: PhysicalToLogical[i] is layer
// Layers[i]'s map, slot -> logical expert.
type Map struct {
	File string
	// Form is "moeprep.placement/v1" or "sglang" (SGLang's
	// --init-expert-location physical_to_logical_map, one row a layer
	// from 0, dense layers included).
	Form              string
	Layers            []int
	PhysicalToLogical [][]int
}

// ReadMap reads a placement written by `moeprep placement --json` or
// SGLang's init_expert_location JSON (physical_to_logical_map [layers][slots]).
// Every row must have the same number of slots and every entry be a
// logical expert id; an error names the file and the row.
func ReadMap(path string) (*Map, error) {
	b, err := readBounded(path, "placement")
	if err != nil {
		return nil, err
	}
	return parseMap(path, b)
}

func parseMap(path string, b []byte) (*Map, error) {
	var doc struct {
		Schema string          `json:"schema"`
		Layers []int           `json:"layers"`
		Map    [][]int         `json:"physical_to_logical_map"`
		Count  json.RawMessage `json:"logical_count"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: not a placement (JSON with physical_to_logical_map [layers][slots]): %v", path, err)
	}
	m := &Map{File: path, PhysicalToLogical: doc.Map}
	switch {
	case doc.Schema == Schema:
		m.Form = Schema
		if len(doc.Layers) != len(doc.Map) {
			return nil, fmt.Errorf("%s: %d layers named, %d rows in physical_to_logical_map", path, len(doc.Layers), len(doc.Map))
		}
		m.Layers = doc.Layers
	case doc.Schema != "":
		return nil, fmt.Errorf("%s: schema %q, want %s or SGLang's physical_to_logical_map", path, doc.Schema, Schema)
	case doc.Map == nil && doc.Count != nil:
		return nil, fmt.Errorf("%s: SGLang's logical_count (recorded loads, which SGLang balances at start): pass it as --placement %s --slots S for moeprep to place", path, path)
	default:
		m.Form = "sglang"
		for i := range doc.Map {
			m.Layers = append(m.Layers, i)
		}
	}
	if len(m.PhysicalToLogical) == 0 || len(m.PhysicalToLogical) > maxLayers {
		return nil, fmt.Errorf("%s: physical_to_logical_map has %d layers, want 1..%d", path, len(m.PhysicalToLogical), maxLayers)
	}
	seen := map[int]bool{}
	for i, row := range m.PhysicalToLogical {
		l := m.Layers[i]
		if l < 0 || l >= maxLayers || seen[l] {
			return nil, fmt.Errorf("%s: layer %d: out of range or named twice", path, l)
		}
		seen[l] = true
		if len(row) == 0 || len(row) > maxExperts || len(row) != len(m.PhysicalToLogical[0]) {
			return nil, fmt.Errorf("%s: layer %d: %d slots, want the first layer's %d (at most %d)", path, l, len(row), len(m.PhysicalToLogical[0]), maxExperts)
		}
		for p, e := range row {
			if e < 0 || e >= maxExperts {
				return nil, fmt.Errorf("%s: layer %d slot %d: expert %d", path, l, p, e)
			}
		}
	}
	return m, nil
}

// Slots is the number of physical slots per layer.
func (m *Map) Slots() int { return len(m.PhysicalToLogical[0]) }

// Row is layer l's map, if the file has one.
func (m *Map) Row(l int) ([]int, bool) {
	for i, x := range m.Layers {
		if x == l {
			return m.PhysicalToLogical[i], true
		}
	}
	return nil, false
}

// CheckRow verifies one layer's map for E experts: every entry an expert
// id below E, every expert in at least one slot (a router's choice must
// have somewhere to go).
func CheckRow(row []int, E int) error {
	seen := make([]bool, E)
	for p, e := range row {
		if e >= E {
			return fmt.Errorf("slot %d holds expert %d, the model has %d", p, e, E)
		}
		seen[e] = true
	}
	for e, ok := range seen {
		if !ok {
			return fmt.Errorf("expert %d has no slot", e)
		}
	}
	return nil
}
