package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// TestMoELayersBeyondNotice: a Llama 4 config trimmed for tests (moe_layers
// naming layers past num_hidden_layers, as transformers 5.17 writes it)
// runs every command, each saying once on stderr, even with -q, what it
// ignored, and carrying it in its JSON (notices, validate's notes).
func TestMoELayersBeyondNotice(t *testing.T) {
	src := filepath.Join(t.TempDir(), "llama4-trimmed")
	testkit.CopyDir(t, filepath.Join(fixturesDir, "llama4-text"), src)
	testkit.EditJSON(t, filepath.Join(src, "config.json"), func(m map[string]any) { m["moe_layers"] = []any{1, 3, 5, 7} })
	const note = "config.json: moe_layers lists 5 and 7 beyond num_hidden_layers=4: ignored, as transformers ignores them"
	dst := filepath.Join(t.TempDir(), "out")
	for _, c := range []struct {
		args []string
		key  string // the JSON field that carries it
	}{
		{[]string{"inspect", "--json", src}, "notices"},
		{[]string{"convert", "-q", "--dry-run", "--json", src, dst}, "notices"},
		{[]string{"convert", "-q", "--json", src, dst}, "notices"},
		{[]string{"validate", "-q", "--device", "cpu", "--json", "--golden", src, src, dst}, "notes"},
	} {
		code, out, stderr := runCLI(t, c.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, stderr)
		}
		if want := c.args[0] + ": " + note + "\n"; stderr != want {
			t.Errorf("%v: stderr %q, want %q", c.args, stderr, want)
		}
		var doc map[string]any
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatal(err)
		}
		got, _ := doc[c.key].([]any)
		if !slices.Contains(got, any(note)) {
			t.Errorf("%v: %s %v, want %q", c.args, c.key, doc[c.key], note)
		}
		if c.args[0] == "inspect" && fmt.Sprint(doc["moe_layers"]) != "[1 3]" {
			t.Errorf("inspect --json: moe_layers %v, want [1 3]", doc["moe_layers"])
		}
	}
}
