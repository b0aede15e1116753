package redteam

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// escName carries the sequences that would erase the error line on a
// terminal and paint a verdict over it.
const escName = "model.layers.1.mlp.evil\x1b[2K\x1b[1A\rall checks PASS"

// TestTerminalInjection: names read from a checkpoint reach the terminal
// escaped (issue 26, case 16). Every case fails, and its error names the
// hostile string: stdout and stderr carry no raw ESC (assertSane checks
// every run for that) and the error shows it as \x1b.
func TestTerminalInjection(t *testing.T) {
	src := tinySrc(t)
	cases := []struct {
		name  string
		build func(t *testing.T, dir string) (in string)
		runs  [][]string // with {in} and {out}
		want  expect
	}{
		{
			// A tensor whose data_offsets do not match its shape: the
			// reader must name it.
			name: "tensor name in a malformed SRC shard",
			build: func(t *testing.T, dir string) string {
				in := tinyInput(t, dir, "model.safetensors")
				st := readST(t, filepath.Join(in, "model.safetensors"))
				st.add(escName, "BF16", []int64{4}, make([]byte, 6))
				st.write(t, filepath.Join(in, "model.safetensors"))
				return in
			},
			runs: [][]string{inspectRun, {"inspect", "--no-progress", "--json", "{in}"}, convertRun},
			want: code(2, names("model.safetensors"), `\\x1b\[2K`),
		},
		{
			// An expert's tensor renamed: the planner, not the reader,
			// rejects it, and names it in its own words.
			name: "expert tensor name in SRC",
			build: func(t *testing.T, dir string) string {
				in := tinyInput(t, dir, "model.safetensors")
				st := readST(t, filepath.Join(in, "model.safetensors"))
				st.rename(t, "model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.1.mlp.experts.3\x1b[2K\x1b[1A\rall checks PASS.up_proj.weight")
				st.write(t, filepath.Join(in, "model.safetensors"))
				return in
			},
			runs: [][]string{inspectRun, {"inspect", "--no-progress", "--json", "{in}"}, convertRun},
			want: code(2, nil, `\\x1b\[2K`),
		},
		{
			name: "model_type in config.json",
			build: func(t *testing.T, dir string) string {
				in := tinyInput(t, dir, "config.json")
				testkit.EditJSON(t, filepath.Join(in, "config.json"), func(m map[string]any) { m["model_type"] = escName })
				return in
			},
			runs: [][]string{inspectRun, {"inspect", "--no-progress", "--json", "{in}"}, convertRun},
			want: code(2, names("config.json"), `\\x1b\[2K`),
		},
		{
			// A file convert would have to copy, named with the sequences,
			// that it cannot copy (a FIFO).
			name: "file name in SRC",
			build: func(t *testing.T, dir string) string {
				in := tinyInput(t, dir)
				if err := syscall.Mkfifo(filepath.Join(in, "notes\x1b[2K\x1b[1A\rall checks PASS"), 0o644); err != nil {
					t.Fatal(err)
				}
				return in
			},
			runs: [][]string{convertRun},
			want: code(2, names("notes"), `\\x1b\[2K`),
		},
		{
			// An extra tensor in DST, its shard, index and manifest
			// consistent: validate must fail naming it.
			name: "extra tensor in DST",
			build: func(t *testing.T, dir string) string {
				dst := filepath.Join(dir, "dst")
				testkit.CopyDir(t, tinyFused(t), dst)
				shard := filepath.Base(onlyFile(t, dst, "model-*.safetensors"))
				st := readST(t, filepath.Join(dst, shard))
				st.add(escName, "BF16", []int64{4}, make([]byte, 8))
				st.write(t, filepath.Join(dst, shard))
				testkit.EditJSON(t, filepath.Join(dst, "model.safetensors.index.json"), func(m map[string]any) {
					m["weight_map"].(map[string]any)[escName] = shard
				})
				rehash(t, dst, shard, "model.safetensors.index.json")
				return dst
			},
			runs: [][]string{{"validate", "--no-progress", "--bytes", src, "{in}"}, {"validate", "--no-progress", "--device", "cpu", src, "{in}"}},
			want: code(1, nil, `\\x1b\[2K`),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			in := c.build(t, dir)
			for _, run := range c.runs {
				out := filepath.Join(dir, "out")
				args := make([]string, len(run))
				for i, a := range run {
					args[i] = strings.ReplaceAll(strings.ReplaceAll(a, "{in}", in), "{out}", out)
				}
				check(t, runMoeprep(t, caseTimeout, args...), c.want)
				assertAbsent(t, out, out+".partial")
			}
		})
	}
}
