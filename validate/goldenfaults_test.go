package validate

import (
	"context"
	"encoding/binary"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/judge"
)

// Issue 41's goldens: a golden's faults are the golden's, named by its file
// and tensor; an ERNIE-4.5-VL golden of a text prompt (token types all 0,
// or none at all) checks the text bank and leaves the vision bank to the
// rest of the run, saying so.

// TestHashGoldenIDsPastTable: a golden whose input_ids run past
// DeepSeek-V4's tid2eid table is a golden of another vocabulary: the error
// names the golden file, its tensor, the token, the id and the table's
// size, never a checkpoint file, and it is unusable input (exit 2), with
// SRC and DST and with DST alone.
func TestHashGoldenIDsPastTable(t *testing.T) {
	src := synthFrom(t, map[string]fixtures.SynthSpec{"v4": hashEveryLayer}, "v4")
	golden := writeHashGoldens(t, src, 40)
	path := filepath.Join(golden, GoldenFileName(1))
	editGolden(t, path, "input_ids", func(raw []byte) {
		binary.LittleEndian.PutUint64(raw[8*5:], uint64(hashEveryLayer.Vocab))
	})
	dst := convertInto(t, src, convert.Options{})
	for _, o := range []Options{{Src: src, Dst: dst}, {Dst: dst}} {
		o.Golden, o.Seed, o.Layers, o.Device = golden, 11, "1", DeviceCPU
		_, err := Run(context.Background(), o)
		want := path + ": tensor input_ids: token 5 has id 96, past the 96 rows of layer 1's hash routing table model.layers.1.ffn.gate.tid2eid"
		if err == nil || !strings.Contains(err.Error(), want) || exitcode.Code(err) != exitcode.BadInput {
			t.Errorf("src %q: %v (exit %d), want exit 2 and %q", o.Src, err, exitcode.Code(err), want)
			continue
		}
		if strings.Contains(err.Error(), src) || strings.Contains(err.Error(), dst) {
			t.Errorf("src %q: %v names a checkpoint", o.Src, err)
		}
	}
}

// editGolden rewrites one tensor's bytes in a golden file (names, dtypes,
// shapes unchanged).
func editGolden(t *testing.T, path, name string, edit func(raw []byte)) {
	t.Helper()
	dir := t.TempDir()
	testkit.CopyFile(t, path, filepath.Join(dir, "model.safetensors"))
	rewriteTensor(t, dir, name, func(raw []byte, _ []int64) { edit(raw) })
	testkit.CopyFile(t, filepath.Join(dir, "model.safetensors"), path)
}

// textGoldens writes, for each decoder layer of the ERNIE-4.5-VL fixture,
// a golden of its text tokens alone: what HF's capture of a text prompt
// holds. withTypes adds token_type_ids, all 0; without, the golden has
// none, as a text-only export may write it.
func textGoldens(t *testing.T, src string, withTypes bool) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []int{1, 2} {
		g, err := ReadGolden(filepath.Join(src, "reference", GoldenFileName(d)), 64)
		if err != nil {
			t.Fatal(err)
		}
		txt, err := g.ForBank(family.BankText, "")
		if err != nil {
			t.Fatal(err)
		}
		tk, k := int64(txt.T), int64(txt.K)
		ids := make([]byte, 4*len(txt.IDs))
		for i, v := range txt.IDs {
			binary.LittleEndian.PutUint32(ids[4*i:], uint32(v))
		}
		entries := []safetensors.Entry{
			memEntry("x", safetensors.F32, []int64{tk, 64}, testkit.F32LE(txt.X...)),
			memEntry("y", safetensors.F32, []int64{tk, 64}, testkit.F32LE(txt.Y...)),
			memEntry("topk_ids", safetensors.I32, []int64{tk, k}, ids),
			memEntry("topk_weights", safetensors.F32, []int64{tk, k}, testkit.F32LE(txt.Weights...)),
		}
		if withTypes {
			entries = append(entries, memEntry("token_type_ids", safetensors.I64, []int64{tk}, make([]byte, 8*tk)))
		}
		if _, err := safetensors.WriteFile(context.Background(), filepath.Join(dir, GoldenFileName(d)), nil, entries, nil); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestErnieVLTextGoldens: a golden of a text prompt (token types all 0, or
// none) checks each layer's text bank against HF; the vision bank, which
// none of its tokens took, runs against SRC on drawn and forced tokens and
// is reported "not checked against the golden" in the table and the JSON.
// Without SRC the vision bank is not checked at all, and the report says
// why. A changed expert of either bank still fails.
func TestErnieVLTextGoldens(t *testing.T) {
	src := hfFixtures + "/ernie4-5-vl-moe"
	dst := convertInto(t, src, convert.Options{})
	vision := []int{1 + 65536, 2 + 65536}
	for _, withTypes := range []bool{true, false} {
		golden := textGoldens(t, src, withTypes)
		rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: golden, Seed: 1})
		if err != nil {
			t.Fatalf("types %v: %v", withTypes, err)
		}
		mustPass(t, rep, "a text prompt's golden")
		rows := map[string][]string{}
		for _, r := range rep.Rows {
			rows[r.label()] = append(rows[r.label()], r.Check)
		}
		for _, d := range []string{"1", "2"} {
			if got := rows[d+" text"]; !slices.Contains(got, judge.FusedVsGolden) || !slices.Contains(got, judge.ReferenceVsGolden) {
				t.Errorf("types %v: layer %s text rows %v, want the golden's", withTypes, d, got)
			}
			got := rows[d+" vision"]
			if !slices.Contains(got, judge.FusedVsReference) || !slices.Contains(got, judge.Coverage) || slices.Contains(got, judge.FusedVsGolden) {
				t.Errorf("types %v: layer %s vision rows %v, want SRC's and no golden's", withTypes, d, got)
			}
		}
		if !slices.Equal(rep.GoldenNotChecked, vision) || len(rep.LayersNotChecked) != 0 {
			t.Errorf("types %v: not checked against the golden %v, not checked %v; want %v and none", withTypes, rep.GoldenNotChecked, rep.LayersNotChecked, vision)
		}
		var table, js jsonBuf
		if err := rep.WriteTable(&table); err != nil || !strings.Contains(table.String(), "note: layer 2 (vision bank) not checked against the golden: no token of") {
			t.Errorf("types %v: table does not say the vision bank was not checked against the golden: %v\n%s", withTypes, err, table)
		}
		if err := rep.WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"not_checked_against_golden": [
    65537,
    65538
  ]`) {
			t.Errorf("types %v: JSON: %v\n%s", withTypes, err, js)
		}

		// DST alone: the text banks against the golden, the vision banks
		// not checked, and said so.
		rep, err = Run(context.Background(), Options{Dst: dst, Golden: golden, Seed: 1, SampleExperts: 1})
		if err != nil {
			t.Fatalf("types %v, DST alone: %v", withTypes, err)
		}
		mustPass(t, rep, "DST alone against a text prompt's golden")
		if !slices.Equal(rep.LayersNotChecked, vision) || len(rep.GoldenNotChecked) != 0 ||
			!strings.Contains(strings.Join(rep.Notes, "\n"), "layer 1 (vision bank) not checked: no token of its golden") {
			t.Errorf("types %v, DST alone: not checked %v %v, notes %q", withTypes, rep.LayersNotChecked, rep.GoldenNotChecked, rep.Notes)
		}
	}

	// One expert row doubled in either bank fails: the text bank against
	// the golden and SRC, the vision bank against SRC (its forced tokens).
	golden := textGoldens(t, src, false)
	for bank, want := range map[string][]string{"text": {"layer 2 text fused-vs-golden", "layer 2 text coverage"}, "vision": {"layer 2 vision coverage"}} {
		bad := convertInto(t, src, convert.Options{})
		rewriteTensor(t, bad, "model.layers.2.mlp."+bank+"_moe.experts.all_down.weight", func(raw []byte, shape []int64) {
			per := len(raw) / int(shape[0])
			doubleBF16(raw[3*per+2*9*int(shape[2]):], int(shape[2])) // expert 3, row 9 doubled
		})
		rep, err := Run(context.Background(), Options{Src: src, Dst: bad, Golden: golden, Seed: 1, Bytes: BytesOff})
		if err != nil {
			t.Fatalf("%s bank changed: %v", bank, err)
		}
		if err := rep.Err(); err == nil || exitcode.Code(err) != exitcode.CheckFailed {
			t.Fatalf("%s bank changed: passed (%v)", bank, err)
		} else {
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s bank changed: %v, want %q", bank, err, w)
				}
			}
			t.Logf("%s bank changed: %v", bank, firstLine(err.Error()))
		}
	}
}
