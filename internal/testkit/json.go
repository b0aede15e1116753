package testkit

import (
	"bytes"
	"encoding/json"
	"testing"
)

// ReadJSON is the JSON object in path (numbers as float64).
func ReadJSON(t testing.TB, path string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(ReadFile(t, path), &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// EditJSON rewrites the JSON object in path through edit, indented. The
// numbers edit does not touch keep their text (edit sees them as
// json.Number).
func EditJSON(t testing.TB, path string, edit func(map[string]any)) {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(ReadFile(t, path)))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	edit(m)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	WriteFile(t, path, append(b, '\n'))
}
