package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit"
)

// synthSummary reads DIR/moeprep-synth.json.
func synthSummary(t *testing.T, dir string) fixtures.Summary {
	t.Helper()
	b := testkit.ReadFile(t, filepath.Join(dir, fixtures.SummaryFile))
	var s fixtures.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// Every model type the detector plans can be written by --family alone,
// and inspect reads it back as that model type.
func TestFixtureSynthEveryFamily(t *testing.T) {
	for _, mt := range family.SupportedModelTypes() {
		dir := filepath.Join(t.TempDir(), mt)
		code, stdout, stderr := runCLI(t, "fixture", "synth", "-q", "--family", mt, dir)
		if code != 0 {
			t.Errorf("%s: exit %d: %s", mt, code, stderr)
			continue
		}
		if !strings.HasPrefix(strings.Replace(stdout, ":\n  ", ": ", 1), "wrote "+dir+": "+mt+" bf16, 2 layers (") || stderr != "" {
			t.Errorf("%s: stdout %q, stderr %q", mt, stdout, stderr)
		}
		code, stdout, stderr = runCLI(t, "inspect", "--json", dir)
		var doc struct {
			ModelType  string `json:"model_type"`
			NumExperts int    `json:"num_experts"`
			MoELayers  []int  `json:"moe_layers"`
		}
		if code != 0 || json.Unmarshal([]byte(stdout), &doc) != nil || doc.ModelType != mt || doc.NumExperts != 8 || len(doc.MoELayers) == 0 {
			t.Errorf("%s: inspect exit %d, %+v, %s", mt, code, doc, stderr)
		}
	}
}

// The summary line counts in words that agree with their numbers, and
// sizes in decimal units.
func TestFixtureSynthSummaryLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--family", "glm4_moe", "--num-layers", "3", "--dense-layers", "1", "--mtp-layers", "1", "--experts", "16", "--top-k", "4"},
			`glm4_moe bf16, 3 layers \(2 MoE\) \+ 1 MTP layer, 16 experts \+ 1 shared, top-4, [0-9.]+ kB in 5 files$`},
		{[]string{"--family", "mixtral", "--num-layers", "1", "--experts", "1", "--top-k", "1", "--max-shard-size", "20kB"},
			`mixtral bf16, 1 layer \(1 MoE\), 1 expert, top-1, [0-9.]+ kB in [0-9]+ files$`},
		{[]string{"--preset", "tiny-deepseek-v4"},
			`deepseek_v4 bf16, 3 layers \(3 MoE, 2 hash-routed\), 8 experts \+ 1 shared, top-2, [0-9.]+ kB in 5 files$`},
		{[]string{"--preset", "tiny-jamba", "--hidden", "1024", "--intermediate", "512"},
			`jamba bf16, 4 layers \(2 MoE\), 8 experts, top-2, [0-9.]+ MB in 5 files$`},
	} {
		dir := filepath.Join(t.TempDir(), "ckpt")
		code, stdout, stderr := runCLI(t, append(append([]string{"fixture", "synth", "--quiet"}, c.args...), dir)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, stderr)
		}
		if !regexp.MustCompile("^wrote " + regexp.QuoteMeta(dir) + ":( |\n  )" + c.want).MatchString(strings.TrimSuffix(stdout, "\n")) {
			t.Errorf("%v: %q, want %s", c.args, stdout, c.want)
		}
	}
}

// --json prints the summary DIR/moeprep-synth.json holds (plus dir), schema first.
func TestFixtureSynthJSON(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	code, stdout, stderr := runCLI(t, "fixture", "synth", "--no-progress", "--json", "--preset", "tiny-inkling-text", "--max-shard-size", "50kB", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.HasPrefix(stdout, "{\n  \"schema\": \""+fixtures.SummarySchema+"\",\n") {
		t.Errorf("stdout does not start with the schema: %.80q", stdout)
	}
	var got fixtures.Summary
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatal(err)
	}
	file := synthSummary(t, dir)
	if got.Dir != dir || got.ModelType != "inkling_text" || got.SharedExperts != 2 || len(got.Files) < 5 ||
		got.Spec != file.Spec || len(got.Files) != len(file.Files) || got.Bytes != file.Bytes {
		t.Errorf("--json %+v\nfile %+v", got, file)
	}
}

// The old flag names still work, say they are deprecated on stderr (never
// on stdout, which carries the summary), and write the same bytes.
func TestFixtureSynthDeprecatedAliases(t *testing.T) {
	base := t.TempDir()
	oldDir, newDir := filepath.Join(base, "old"), filepath.Join(base, "new")
	code, stdout, stderr := runCLI(t, "fixture", "synth", "--no-progress", "--json", "--family", "qwen3_moe", "--layers", "3",
		"--dense-layers", "1", "--shard-size", "30kB", oldDir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, f := range []string{"--layers", "--shard-size"} {
		if !strings.Contains(stderr, "Flag "+f+" has been deprecated") {
			t.Errorf("stderr %q does not say %s is deprecated", stderr, f)
		}
	}
	var doc fixtures.Summary
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("stdout is not the JSON summary alone: %v: %q", err, stdout)
	}
	if code, _, stderr := runCLI(t, "fixture", "synth", "-q", "--family", "qwen3_moe", "--num-layers", "3",
		"--dense-layers", "1", "--max-shard-size", "30kB", newDir); code != 0 || stderr != "" {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	old, cur := synthSummary(t, oldDir), synthSummary(t, newDir)
	shards := 0
	for _, f := range old.Files {
		if strings.HasPrefix(f.Name, "model-") {
			shards++
		}
	}
	if old.Layers != 3 || len(old.MoELayers) != 2 || shards < 2 {
		t.Errorf("--layers 3 --shard-size 30kB gave %d layers, MoE %v, %d shards", old.Layers, old.MoELayers, shards)
	}
	b1, _ := json.Marshal(old.Files)
	b2, _ := json.Marshal(cur.Files)
	if string(b1) != string(b2) {
		t.Errorf("old and new flag names wrote different files:\n%s\n%s", b1, b2)
	}
}

// -f/--force replaces only a checkpoint synth wrote; anything else is
// refused with exit 2, naming it, and left in place.
func TestFixtureSynthForce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	args := func(extra ...string) []string {
		return append(append([]string{"fixture", "synth", "-q", "--preset", "tiny-hy-v3"}, extra...), dir)
	}
	if code, _, stderr := runCLI(t, args()...); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	code, _, stderr := runCLI(t, args("--seed", "5")...)
	if code != 2 {
		t.Errorf("over an existing checkpoint without --force: exit %d", code)
	}
	assertCleanError(t, stderr, dir, "--force replaces it")
	for _, f := range []string{"-f", "--force"} {
		if code, _, stderr := runCLI(t, args(f, "--seed", "5")...); code != 0 {
			t.Errorf("%s: exit %d: %s", f, code, stderr)
		}
	}
	if s := synthSummary(t, dir); s.Spec.Seed != 5 {
		t.Errorf("--force left seed %d", s.Spec.Seed)
	}
	readme := filepath.Join(dir, "README.md")
	testkit.WriteFile(t, readme, []byte("my notes"))
	code, _, stderr = runCLI(t, args("-f", "--seed", "6")...)
	if code != 2 {
		t.Errorf("--force over a user's file: exit %d", code)
	}
	assertCleanError(t, stderr, dir, "README.md")
	if b, err := os.ReadFile(readme); err != nil || string(b) != "my notes" {
		t.Errorf("the user's file: %v %q", err, b)
	}
	if s := synthSummary(t, dir); s.Spec.Seed != 5 {
		t.Errorf("a refused run changed the checkpoint (seed %d)", s.Spec.Seed)
	}
}

func TestFixtureSynthErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--family", "llama"}, []string{`unknown family "llama"; did you mean llama4_text?`, "`moeprep fixture synth --help` lists all"}},
		{[]string{"--experts", "8"}, []string{"give --preset or --family", "deepseek_v4"}},
		{[]string{"--preset", "nope"}, []string{"--preset", `unknown preset "nope" (`, "`moeprep fixture synth --help` lists all"}},
		{[]string{"--preset", "tiny-gpt-os"}, []string{`unknown preset "tiny-gpt-os"; did you mean tiny-gpt-oss`}},
		{[]string{"--family", "gpt_oss", "--dtype", "fp8"}, []string{"stacked on disk"}},
		{[]string{"--family", "mixtral", "--max-shard-size", "lots"}, []string{"--max-shard-size"}},
	} {
		dir := filepath.Join(t.TempDir(), "ckpt")
		code, stdout, stderr := runCLI(t, append(append([]string{"fixture", "synth", "-q"}, c.args...), dir)...)
		if code != 2 || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q", c.args, code, stdout)
		}
		assertCleanError(t, stderr, c.want...)
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("%v: wrote %s", c.args, dir)
		}
	}
}

// The help lists every model type the detector plans (so it cannot claim
// more or fewer than the code does) and every preset.
func TestFixtureSynthHelp(t *testing.T) {
	code, stdout, _ := runCLI(t, "fixture", "synth", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	flat := strings.Join(strings.Fields(stdout), " ")
	for _, mt := range family.SupportedModelTypes() {
		if !strings.Contains(flat, " "+mt+",") && !strings.Contains(flat, " "+mt+" ") {
			t.Errorf("help does not list %s", mt)
		}
	}
	for _, p := range fixtures.PresetNames() {
		if !strings.Contains(flat, p) {
			t.Errorf("help does not list preset %s", p)
		}
	}
	for _, hidden := range []string{"--layers ", "--shard-size "} {
		if strings.Contains(stdout, hidden) {
			t.Errorf("help shows the deprecated %s", hidden)
		}
	}
}

// Shell completion offers the values of --family, --preset and --dtype.
func TestFixtureSynthCompletion(t *testing.T) {
	for _, c := range []struct {
		flag, prefix string
		want         []string
	}{
		{"--family", "gl", []string{"glm4_moe", "glm4_moe_lite", "glm_moe_dsa"}},
		{"--family", "", family.SupportedModelTypes()},
		{"--preset", "tiny-gpt", []string{"tiny-gpt-oss"}},
		{"--dtype", "", []string{"bf16", "f16", "f32", "fp8", "fp8-channel", "fp8-tensor", "int4-pack", "nvfp4", "nvfp4-ct", "nvfp4-mixed", "mxfp4", "mxfp4-ct", "fp4-experts", "mxfp8", "mxfp8-minimax", "nvfp4-mxfp8"}},
	} {
		code, stdout, stderr := runCLI(t, "__complete", "fixture", "synth", c.flag, c.prefix)
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if code != 0 || len(lines) == 0 || lines[len(lines)-1] != ":4" {
			t.Errorf("%s %q: exit %d, %q %s", c.flag, c.prefix, code, stdout, stderr)
			continue
		}
		if got := strings.Join(lines[:len(lines)-1], " "); got != strings.Join(c.want, " ") {
			t.Errorf("%s %q completes to %q, want %q", c.flag, c.prefix, got, c.want)
		}
	}
}

// --dtype's help names every dtype the spec takes, and no other: the list
// the spec's own refusal gives is the independent statement.
func TestFixtureSynthDTypeHelpComplete(t *testing.T) {
	_, err := fixtures.SynthSpec{Family: "mixtral", DType: "no-such-dtype"}.Normalize()
	if err == nil {
		t.Fatal("an unknown dtype was accepted")
	}
	m := regexp.MustCompile(`want (.*)$`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("refusal %q lists no dtypes", err)
	}
	want := map[string]bool{}
	for _, d := range strings.Split(strings.ReplaceAll(m[1], " or ", ", "), ", ") {
		want[d] = true
	}
	got := map[string]bool{}
	for _, d := range synthDTypes {
		got[d] = true
		if !want[d] {
			t.Errorf("--dtype's help names %q, which the spec refuses", d)
		}
	}
	for d := range want {
		if !got[d] {
			t.Errorf("--dtype's help leaves out %q, which the spec takes", d)
		}
	}
	code, help, _ := runCLI(t, "fixture", "synth", "--help")
	if code != 0 {
		t.Fatalf("fixture synth --help: exit %d", code)
	}
	for _, d := range synthDTypes {
		if !strings.Contains(help, "\n  "+d+" ") {
			t.Errorf("the long help's table has no row for %q", d)
		}
	}
}

// synth says how much a preset writes: beside each preset in --help,
// before it writes, and with --dry-run instead of writing.
func TestFixtureSynthSizes(t *testing.T) {
	code, out, _ := runCLI(t, "fixture", "synth", "--help")
	if code != 0 || !regexp.MustCompile(`deepseek-v3-shaped +2\d\.\d GB`).MatchString(out) || !regexp.MustCompile(`tiny-qwen3-moe +3\d\d kB`).MatchString(out) {
		t.Fatalf("--help: exit %d\n%s", code, out)
	}
	dir := filepath.Join(t.TempDir(), "big")
	code, out, errOut := runCLI(t, "fixture", "synth", "--preset", "deepseek-v3-shaped", "--num-layers", "4", "--dry-run", dir)
	if code != 0 || out != "would write "+dir+":\n  deepseek_v3 fp8, 4 layers, 256 experts + 1 shared, top-8, 34.4 GB (dry run: nothing written)\n" {
		t.Fatalf("--dry-run: exit %d\n%q\n%s", code, out, errOut)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("--dry-run left %s: %v", dir, err)
	}
	if _, err := os.Stat(dir + ".partial"); !os.IsNotExist(err) {
		t.Errorf("--dry-run left %s.partial: %v", dir, err)
	}
	small := filepath.Join(t.TempDir(), "small")
	code, _, errOut = runCLI(t, "fixture", "synth", "--preset", "tiny-qwen3-moe", small)
	if code != 0 || !strings.HasPrefix(errOut, "synth: writing 343 kB to "+small+"\n") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}
