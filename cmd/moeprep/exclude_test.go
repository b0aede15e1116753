package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// A gpt-oss-style repo whose original/ and metal/ folders each hold another
// copy of the model: the default copies them and says so by name; --exclude
// leaves them out, the contract lists each file left out, and validate
// passes such a DST (noting what was left out) while still failing one that
// lost a file by accident or whose contract names a file SRC lacks.
func TestConvertExclude(t *testing.T) {
	src := filepath.Join(t.TempDir(), "gpt-oss")
	testkit.CopyDir(t, filepath.Join("..", "..", "fixtures", "hf", "gpt-oss"), src)
	model := testkit.ReadFile(t, filepath.Join(src, "model.safetensors"))
	for _, f := range []string{"original/model.safetensors", "metal/model.bin"} {
		p := filepath.Join(src, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, model, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WriteFile(t, filepath.Join(src, "original", "config.json"), []byte("{}\n"))

	all := filepath.Join(t.TempDir(), "all")
	code, out, errOut := runCLI(t, "convert", "-q", src, all)
	if code != 0 || !strings.Contains(errOut, "convert: copying original/, 274 kB of weights (2 files); ") || !strings.Contains(errOut, "--exclude 'original' leaves it out") ||
		!strings.Contains(errOut, "convert: copying metal/, 274 kB of weights (1 file); --exclude 'metal' leaves it out\n") || !strings.Contains(out, "copied 6 files, ") {
		t.Fatalf("default: exit %d\n%s\n%s", code, out, errOut)
	}

	dst := filepath.Join(t.TempDir(), "slim")
	code, out, errOut = runCLI(t, "convert", "-q", "--exclude", "original", "--exclude", "metal/*", src, dst)
	if code != 0 || strings.Contains(errOut, "copying") || !strings.Contains(out, "excluded 3 files: metal/model.bin, original/config.json, original/model.safetensors") {
		t.Fatalf("--exclude: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, f := range []string{"original", "metal"} {
		if _, err := os.Stat(filepath.Join(dst, f)); !os.IsNotExist(err) {
			t.Errorf("DST holds %s: %v", f, err)
		}
	}
	cfg := testkit.ReadJSON(t, filepath.Join(dst, "config.json"))
	ex, _ := cfg["moeprep"].(map[string]any)["excluded_files"].([]any)
	if len(ex) != 3 || ex[0] != "metal/model.bin" || ex[2] != "original/model.safetensors" {
		t.Errorf("contract excluded_files %v", ex)
	}
	code, out, errOut = runCLI(t, "validate", "--device", "cpu", src, dst)
	if code != 0 || !strings.Contains(out, "DST leaves out 3 of SRC's files on purpose") {
		t.Fatalf("validate: exit %d\n%s\n%s", code, out, errOut)
	}

	// A file lost by accident still fails, naming it.
	lost := filepath.Join(t.TempDir(), "lost")
	testkit.CopyDir(t, dst, lost)
	if err := os.Remove(filepath.Join(lost, "generation_config.json")); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runCLI(t, "validate", "--device", "cpu", "--bytes", src, lost); code != 1 || !strings.Contains(out, "generation_config.json") {
		t.Errorf("a lost file: exit %d\n%s", code, out)
	}
	// A contract naming a file SRC lacks fails too.
	forged := filepath.Join(t.TempDir(), "forged")
	testkit.CopyDir(t, dst, forged)
	p := filepath.Join(forged, "config.json")
	b := testkit.ReadFile(t, p)
	b = bytes.Replace(b, []byte(`"metal/model.bin",`), []byte(`"metal/model.bin", "metal/other.bin",`), 1)
	testkit.WriteFile(t, p, b)
	if code, out, errOut := runCLI(t, "validate", "--device", "cpu", "--bytes", src, forged); code != 1 || !strings.Contains(out+errOut, "metal/other.bin") {
		t.Errorf("a forged excluded_files: exit %d\n%s\n%s", code, out, errOut)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--exclude", "nothing"}, `--exclude "nothing" names no file of SRC that moeprep would copy`},
		{[]string{"--exclude", "*.safetensors"}, `--exclude "*.safetensors" names model.safetensors, which moeprep reads to write the output`},
		{[]string{"--exclude", "../x"}, `--exclude "../x": not a pattern of paths inside SRC`},
		{[]string{"--exclude", "[a"}, `--exclude "[a": not a pattern of paths inside SRC`},
	} {
		code, _, errOut := runCLI(t, append(append([]string{"convert", "-q", "--dry-run"}, tc.args...), src, filepath.Join(t.TempDir(), "x"))...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q; want %q", tc.args, code, errOut, tc.want)
		}
	}
}
