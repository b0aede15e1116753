package convert

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/fixtures"
)

// synthPreset writes the synth preset name into a temporary directory.
func synthPreset(t *testing.T, name string) string {
	t.Helper()
	spec, err := fixtures.Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), name)
	if err := fixtures.Synth(context.Background(), src, spec, nil); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestSynthPresets converts every tiny synthetic preset the fixtures package
// writes (MTP layers with experts, Kimi-K2's 24 experts, FP8 with partial
// 128x128 blocks, DeepSeek-V2's two shared experts, every family) through the
// same plan-driven verification as the HF fixtures.
func TestSynthPresets(t *testing.T) {
	n := 0
	family := map[string]bool{} // every family's small preset, tiny- or small- (fixtures.TinyPresetName)
	for _, mt := range fixtures.Families() {
		family[fixtures.TinyPresetName(mt)] = true
	}
	for _, name := range fixtures.PresetNames() {
		if !strings.HasPrefix(name, "tiny-") && !family[name] && !strings.HasSuffix(name, "-mxfp8") {
			continue
		}
		n++
		checkHFFixture(t, synthPreset(t, name))
	}
	if n < 6 {
		t.Fatalf("only %d tiny presets", n)
	}
}
