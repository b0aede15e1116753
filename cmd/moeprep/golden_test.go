package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// goldenJSON compares a command's JSON output, with the fields that differ
// from run to run (paths, times, rates, free space) replaced by a marker,
// against testdata/name; -update rewrites it.
func goldenJSON(t *testing.T, name, out string, volatile ...string) {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%s: not JSON: %v\n%s", name, err, out)
	}
	if s, _ := doc["schema"].(string); s == "" {
		t.Errorf("%s: no schema field", name)
	}
	for _, k := range volatile {
		if _, ok := doc[k]; !ok {
			t.Errorf("%s: volatile field %q is missing", name, k)
		}
		doc[k] = "<varies>"
	}
	checkGolden(t, filepath.Join("testdata", name), doc, "update SCHEMAS.md")
}

// checkGolden writes doc as moeprep writes JSON (indented by two spaces, no
// HTML escapes) and compares it with the golden file path; -update
// rewrites the file instead. docs says which documentation a meant change
// updates too.
func checkGolden(t *testing.T, path string, doc any, docs string) {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	got := buf.Bytes()
	if *update {
		testkit.WriteFile(t, path, got)
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (if the change is meant, rerun with -update and %s):\n%s", path, docs, lineDiff(string(want), string(got)))
	}
}

// Every --json document has a schema and the fields SCHEMAS.md documents.
func TestJSONGolden(t *testing.T) {
	src := filepath.Join(fixturesDir, "deepseek-v3-fp8")
	dir := t.TempDir()
	cases := []struct {
		golden   string
		args     []string
		volatile []string
	}{
		{"inspect.golden.json", []string{"inspect", "--json", src}, []string{"dir"}},
		{"inspect-wrapper.golden.json", []string{"inspect", "--json", filepath.Join(fixturesDir, "kimi-k25")}, []string{"dir"}},
		{"convert-plan.golden.json", []string{"fuse-shared", "--tp", "2", "--dry-run", "--json", src, filepath.Join(dir, "plan")},
			[]string{"src", "dst", "free_bytes", "fits", "read_rate_bytes_per_s", "rate_sample_seconds", "rate_direct_io", "estimated_seconds"}},
		{"convert.golden.json", []string{"fuse-shared", "-q", "--tp", "2", "--json", src, filepath.Join(dir, "out")},
			[]string{"dst", "seconds", "gb_per_s"}},
		{"fixture-synth.golden.json", []string{"fixture", "synth", "-q", "--preset", "tiny-deepseek-v3", "--json", filepath.Join(dir, "synth")}, []string{"dir"}},
		{"convert-resumed.golden.json", []string{"fuse-shared", "-q", "--tp", "2", "--resume", "--json", src, filepath.Join(dir, "out")},
			[]string{"dst", "seconds", "gb_per_s"}},
	}
	for _, c := range cases {
		code, out, stderr := runCLI(t, c.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, stderr)
		}
		goldenJSON(t, c.golden, out, c.volatile...)
	}
	// -o writes the same document, and refuses to overwrite what is not a report.
	report := filepath.Join(dir, "plan.json")
	if code, _, stderr := runCLI(t, "inspect", "-o", report, src); code != 0 {
		t.Fatalf("inspect -o: %s", stderr)
	}
	b := testkit.ReadFile(t, report)
	goldenJSON(t, "inspect.golden.json", string(b), "dir")
	if code, _, _ := runCLI(t, "inspect", "-o", report, src); code != 0 {
		t.Errorf("inspect -o over its own earlier report: exit %d", code)
	}
	for _, bad := range []string{filepath.Join(src, "config.json"), filepath.Join(src, "new.json")} {
		code, _, stderr := runCLI(t, "inspect", "-o", bad, src)
		if code != 2 {
			t.Errorf("-o %s: exit %d, want 2", bad, code)
		}
		assertCleanError(t, stderr, "inside the checkpoint")
	}
	notes := filepath.Join(dir, "notes.txt")
	testkit.WriteFile(t, notes, []byte("mine"))
	code, _, stderr := runCLI(t, "inspect", "-o", notes, src)
	if b, _ := os.ReadFile(notes); code != 2 || string(b) != "mine" {
		t.Errorf("-o over a file that is not a report: exit %d, file now %q", code, b)
	}
	assertCleanError(t, stderr, "is not a moeprep report")
}

// SCHEMAS.md documents every field of every golden document.
func TestSchemasDocumentEveryField(t *testing.T) {
	doc := testkit.ReadFile(t, "../../SCHEMAS.md")
	// validate's report is documented beside its code, SCHEMAS.md links it.
	if v, err := os.ReadFile("../../validate/SCHEMA.md"); err == nil {
		doc = append(doc, v...)
	}
	goldens, _ := filepath.Glob(filepath.Join("testdata", "*.golden.json"))
	if len(goldens) < 4 {
		t.Fatalf("only %d golden files", len(goldens))
	}
	for _, g := range goldens {
		m := testkit.ReadJSON(t, g)
		schema, _ := m["schema"].(string)
		if !bytes.Contains(doc, []byte("`"+schema+"`")) {
			t.Errorf("SCHEMAS.md has no section for %s (%s)", schema, g)
		}
		for k := range m {
			if !bytes.Contains(doc, []byte("`"+k+"`")) {
				t.Errorf("SCHEMAS.md does not document %s's field %q", schema, k)
			}
		}
	}
}

// SCHEMAS.md documents the optional fields the goldens leave out too:
// every JSON key of convert's summary and plan.
func TestSchemasDocumentOptionalFields(t *testing.T) {
	doc := testkit.ReadFile(t, "../../SCHEMAS.md")
	for _, v := range []any{convert.Summary{}, convert.Plan{}} {
		ty := reflect.TypeOf(v)
		for i := range ty.NumField() {
			key, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
			if key != "" && key != "-" && !bytes.Contains(doc, []byte("`"+key+"`")) {
				t.Errorf("SCHEMAS.md does not document %s's field %q", ty.Name(), key)
			}
		}
	}
}
