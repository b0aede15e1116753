package family_test

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
)

// TestMoELayersBeyondTheModel: a Llama 4 config trimmed to fewer layers
// keeps the full model's moe_layers; transformers asks `layer_idx in
// moe_layers` of its own layers only, so the entries past the last name
// nothing. The plan is the untrimmed list's, with one notice naming them.
func TestMoELayersBeyondTheModel(t *testing.T) {
	dir := t.TempDir()
	testkit.CopyDir(t, filepath.Join("..", "fixtures", "hf", "llama4-text"), dir)
	want := cktest.Plan(t, dir)
	if len(want.Notices) != 0 {
		t.Fatalf("fixture: notices %q", want.Notices)
	}
	const ignored = " beyond num_hidden_layers=4: ignored, as transformers ignores them"
	for _, c := range []struct {
		list []any
		note string // "": none
	}{
		{[]any{1, 3}, ""},
		{[]any{1, 3, 4}, "config.json: moe_layers lists 4" + ignored},
		{[]any{7, 1, 5, 3, 99}, "config.json: moe_layers lists 7, 5 and 99" + ignored},
		{[]any{1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, "config.json: moe_layers lists 4, 5, 6, 7, 8, 9, 10, 11 and 2 more" + ignored},
	} {
		testkit.EditJSON(t, filepath.Join(dir, "config.json"), func(m map[string]any) { m["moe_layers"] = c.list })
		p := cktest.Plan(t, dir)
		notices := p.Notices
		p.Notices = nil
		if !reflect.DeepEqual(p, want) {
			t.Errorf("moe_layers %v: the plan differs from the fixture's", c.list)
		}
		if c.note == "" && len(notices) != 0 || c.note != "" && !reflect.DeepEqual(notices, []string{c.note}) {
			t.Errorf("moe_layers %v: notices %q, want %q", c.list, notices, c.note)
		}
	}
	// Entries past the end alone name no layer: refused, as before.
	testkit.EditJSON(t, filepath.Join(dir, "config.json"), func(m map[string]any) { m["moe_layers"] = []any{4, 5} })
	if _, err := cktest.Open(t, dir).Plan(); err == nil || !strings.Contains(err.Error(), "none of the 4 layers is a MoE layer") {
		t.Errorf("moe_layers past the end only: %v", err)
	}
}
