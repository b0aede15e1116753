package family

import (
	"fmt"
	"iter"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// docTable is one markdown table of a document: its header cells and its
// rows' cells, each trimmed.
type docTable struct {
	heading string
	header  []string
	rows    [][]string
}

// col is the index of the header cell named name, -1 if none is.
func (d docTable) col(name string) int { return slices.Index(d.header, name) }

// tableUnder returns the first table after the line "## heading" and
// before the next "## " heading; a document without one fails t.
func tableUnder(t *testing.T, doc, heading string) docTable {
	t.Helper()
	d := docTable{heading: heading}
	in := false
	for line := range strings.Lines(doc) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "## ") {
			if in {
				break
			}
			in = line == "## "+heading
			continue
		}
		if !in || !strings.HasPrefix(line, "|") {
			if in && len(d.header) > 0 && len(d.rows) > 0 {
				break // the table ended
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case d.header == nil:
			d.header = cells
		case strings.HasPrefix(line, "|---"):
		default:
			d.rows = append(d.rows, cells)
		}
	}
	if len(d.rows) == 0 {
		t.Fatalf("MODELS.md has no table under \"## %s\"", heading)
	}
	return d
}

// rowType is the model type a row names: its first cell, one backquoted
// word.
var rowType = regexp.MustCompile("^`([a-z0-9_]+)`$")

// typedRows yields each row with the model type it names (rowType), and
// fails t for a row that names none.
func (d docTable) typedRows(t *testing.T) iter.Seq2[string, []string] {
	return func(yield func(string, []string) bool) {
		for _, r := range d.rows {
			m := rowType.FindStringSubmatch(r[0])
			if m == nil {
				t.Errorf("%s: row %q does not start with one backquoted model type", d.heading, r[0])
				continue
			}
			if !yield(m[1], r) {
				return
			}
		}
	}
}

// TestModelsDocMatchesRegistry holds MODELS.md to the registry: every
// model type config.json may name and Detect plans (a family's or a
// multimodal wrapper's) has exactly one row of "Supported model types",
// every row names one, and its fuse-shared column says "yes" exactly for
// the types FuseSharedModelTypes lists; every row of "Refused model
// types" is refused by Detect, and every type the registry refuses by
// name (unsupported, and the text models read only inside a wrapper) has
// a row there. README's count of them is the registry's too.
func TestModelsDocMatchesRegistry(t *testing.T) {
	b := testkit.ReadFile(t, "../MODELS.md")
	doc := string(b)

	supported := tableUnder(t, doc, "Supported model types")
	fuseCol := supported.col("fuse-shared")
	for _, c := range []string{"model type", "family", "layouts", "fuse-shared", "formats", "status"} {
		if supported.col(c) < 0 {
			t.Errorf("Supported model types: no column %q (header %q)", c, supported.header)
		}
	}
	accepted := slices.Concat(SupportedModelTypes(), SupportedWrappers(), SupportedTextAlone())
	fusable := FuseSharedModelTypes()
	rows := map[string]int{}
	for mt, r := range supported.typedRows(t) {
		rows[mt]++
		if !slices.Contains(accepted, mt) {
			t.Errorf("Supported model types: %s is no model type the registry accepts", mt)
		}
		if len(r) != len(supported.header) {
			t.Errorf("Supported model types: %s: %d cells, want %d", mt, len(r), len(supported.header))
			continue
		}
		if yes := strings.HasPrefix(r[fuseCol], "yes"); yes != slices.Contains(fusable, mt) {
			t.Errorf("Supported model types: %s: fuse-shared %q, but FuseSharedModelTypes lists it: %v", mt, r[fuseCol], !yes)
		}
	}
	for _, mt := range accepted {
		if rows[mt] != 1 {
			t.Errorf("Supported model types: %s has %d rows, want 1", mt, rows[mt])
		}
	}

	refused := tableUnder(t, doc, "Refused model types")
	listed := map[string]bool{}
	for mt := range refused.typedRows(t) {
		if listed[mt] {
			t.Errorf("Refused model types: %s has two rows", mt)
		}
		listed[mt] = true
		if slices.Contains(accepted, mt) {
			t.Errorf("Refused model types: %s is accepted by the registry", mt)
		}
		if _, err := Detect(map[string]any{"model_type": mt}, nil); err == nil || !strings.Contains(err.Error(), "not supported") && !strings.Contains(err.Error(), "inside the wrapper") {
			t.Errorf("Refused model types: Detect of %s: %v, want it refused", mt, err)
		}
	}
	named := slices.Collect(func(yield func(string) bool) {
		for mt := range unsupported {
			if !yield(mt) {
				return
			}
		}
	})
	for _, mt := range named {
		if !listed[mt] {
			t.Errorf("Refused model types: %s, which the registry refuses by name, has no row", mt)
		}
	}

	readme := testkit.ReadFile(t, "../README.md")
	families := map[string]bool{}
	for _, f := range All() {
		families[f.Name()] = true
	}
	want := fmt.Sprintf("%d text model types in %d families and %d multimodal wrappers",
		len(SupportedModelTypes()), len(families), len(SupportedWrappers()))
	if !strings.Contains(strings.Join(strings.Fields(string(readme)), " "), want) {
		t.Errorf("README.md's supported-models summary does not say %q", want)
	}
}
