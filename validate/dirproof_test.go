package validate

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/internal/testkit/cktest"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/byteproof"
)

// dirSource is a SRC with the files a hub checkpoint carries besides its
// weights: a tokenizer config with a chat template, generation_config.json,
// goldens in a sub-directory (reference/), and a hidden file, which moeprep
// does not copy.
func dirSource(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	testkit.CopyDir(t, filepath.Join(hfFixtures, "deepseek-v3-bf16"), src)
	testkit.WriteFile(t, filepath.Join(src, "tokenizer_config.json"), `{"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}`+"\n")
	testkit.WriteFile(t, filepath.Join(src, ".gitattributes"), "*.safetensors filter=lfs\n")
	return src
}

// editManifest rewrites DST's manifest through edit, as someone who can
// write DST would (it is unsigned).
func editManifest(t *testing.T, dst string, edit func(files map[string]layout.FileInfo)) {
	t.Helper()
	p := filepath.Join(dst, layout.ManifestFileName)
	var m layout.Manifest
	if err := json.Unmarshal(testkit.ReadFile(t, p), &m); err != nil {
		t.Fatal(err)
	}
	edit(m.Files)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	testkit.WriteFile(t, p, b)
}

// rehash lists each of rels in DST's manifest with its current size and
// hash: the tampering the manifest alone cannot see.
func rehash(t *testing.T, dst string, rels ...string) {
	t.Helper()
	editManifest(t, dst, func(files map[string]layout.FileInfo) {
		for _, rel := range rels {
			fi, err := layout.HashFile(filepath.Join(dst, filepath.FromSlash(rel)))
			if err != nil {
				t.Fatal(err)
			}
			files[rel] = fi
		}
	})
}

// replaceText edits a DST file as text (so every other byte, every number
// as SRC wrote it, stays) and rehashes it.
func replaceText(t *testing.T, dst, rel, old, new string) {
	t.Helper()
	p := filepath.Join(dst, rel)
	b := testkit.ReadFile(t, p)
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("%s has no %q", p, old)
	}
	testkit.WriteFile(t, p, bytes.Replace(b, []byte(old), []byte(new), 1))
	rehash(t, dst, rel)
}

// forgeContract rewrites only the contract object of DST's config.json
// (the rest keeps SRC's text) and rehashes it.
func forgeContract(t *testing.T, dst string, edit func(c map[string]any)) {
	t.Helper()
	p := filepath.Join(dst, "config.json")
	b := testkit.ReadFile(t, p)
	c := testkit.ReadJSON(t, p)[layout.ContractKey].(map[string]any)
	edit(c)
	cb, err := json.MarshalIndent(c, "  ", "  ")
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.LastIndex(b, []byte(`"`+layout.ContractKey+`":`))
	if i < 0 {
		t.Fatalf("%s: no contract", p)
	}
	out := append(append(append([]byte{}, b[:i]...), `"`+layout.ContractKey+`": `...), cb...)
	testkit.WriteFile(t, p, append(out, "\n}\n"...))
	rehash(t, dst, "config.json")
}

// runBounded runs validate with a deadline: a check that opens a device
// or a pipe named by DST would otherwise hang the test instead of failing it.
func runBounded(t *testing.T, o Options) (*Report, error) {
	t.Helper()
	return testkit.Within(t, "validate", func() (*Report, error) { return Run(context.Background(), o) })
}

// TestDirectoryProof: from a genuine fuse-shared output (which passes),
// each tampering, done as an attacker would (the manifest entry rehashed
// where that hides it from the hashes), fails `validate --bytes` with exit
// 1, the mismatch kind, and the file or key named.
func TestDirectoryProof(t *testing.T) {
	src := dirSource(t)
	outside := filepath.Join(t.TempDir(), "outside")
	testkit.WriteFile(t, outside, "not part of DST\n")
	up := strings.Repeat("../", 32) // from DST, past the root
	// A real file outside DST, listed with its true size and hash: it must
	// be refused by name, not read (its hash never printed).
	host := "/etc/hostname"
	hostFI, err := layout.HashFile(host)
	if err != nil {
		host = outside
		if hostFI, err = layout.HashFile(host); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, dst string)
		kind   string // "": must still pass
		want   string // in the error
	}{
		// config.json: SRC's plus the contract, nothing else
		{"config rms_norm_eps", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", `"rms_norm_eps": 1e-06`, `"rms_norm_eps": 2e-06`)
		}, byteproof.MismatchConfig, "config.json: config: rms_norm_eps is 1e-06 in SRC, 2e-06 in DST"},
		{"config vocab_size", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", `"vocab_size": 64`, `"vocab_size": 65`)
		}, byteproof.MismatchConfig, "vocab_size is 64 in SRC, 65 in DST"},
		{"config eos_token_id", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", `"eos_token_id": 1`, `"eos_token_id": 2`)
		}, byteproof.MismatchConfig, "eos_token_id is 1 in SRC, 2 in DST"},
		{"config nested value", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", `"rope_theta": 10000.0`, `"rope_theta": 20000.0`)
		}, byteproof.MismatchConfig, "rope_parameters.rope_theta is 10000.0 in SRC, 20000.0 in DST"},
		{"config key added", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", "{", `{"auto_map": {"AutoModel": "modeling_x.Model"},`)
		}, byteproof.MismatchConfig, `auto_map is in DST ({"AutoModel":"modeling_x.Model"}), not in SRC`},
		{"config key removed", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", `"use_cache": true,`, ``)
		}, byteproof.MismatchConfig, "use_cache is in SRC (true), not in DST"},
		{"config integer written as a float", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", `"vocab_size": 64`, `"vocab_size": 64.0`)
		}, byteproof.MismatchConfig, "vocab_size is 64 in SRC, 64.0 in DST"},
		{"config duplicate key, the last one SRC's", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", "{", `{"rms_norm_eps": 2e-06,`)
		}, byteproof.MismatchConfig, "rms_norm_eps appears more than once"},
		{"config same value spelt otherwise passes", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", `"rms_norm_eps": 1e-06`, `"rms_norm_eps": 0.000001`)
		}, "", ""},
		// the contract's values against SRC
		{"contract shared_slot_weight", func(t *testing.T, dst string) {
			forgeContract(t, dst, func(c map[string]any) { c["shared_slot_weight"] = 1.0 })
		}, byteproof.MismatchContract, "moeprep.shared_slot_weight is 1, 1 / routed_scaling_factor 2.5 (not folded) gives 0.4"},
		{"contract routed_scaling_factor", func(t *testing.T, dst string) {
			forgeContract(t, dst, func(c map[string]any) { c["routed_scaling_factor"] = 2.0; c["shared_slot_weight"] = 0.5 })
		}, byteproof.MismatchContract, "moeprep.routed_scaling_factor is 2, SRC's config gives 2.5"},
		{"contract layer mtp", func(t *testing.T, dst string) {
			forgeContract(t, dst, func(c map[string]any) {
				c["layers"].([]any)[1].(map[string]any)["mtp"] = true
			})
		}, byteproof.MismatchContract, "moeprep.layers[1]"},
		{"contract unknown key", func(t *testing.T, dst string) {
			forgeContract(t, dst, func(c map[string]any) { c["chat_template_override"] = "x" })
		}, byteproof.MismatchContract, "moeprep.chat_template_override is in DST"},
		{"contract fold_max_rel_change while not folded", func(t *testing.T, dst string) {
			forgeContract(t, dst, func(c map[string]any) { c["fold_max_rel_change"] = 0.001 })
		}, byteproof.MismatchContract, "moeprep.fold_max_rel_change is 0.001, nothing folded gives 0"},
		{"contract tp 0", func(t *testing.T, dst string) {
			forgeContract(t, dst, func(c map[string]any) { c["tp"] = 0 })
		}, byteproof.MismatchContract, "moeprep.tp is 0"},
		{"contract output_scale", func(t *testing.T, dst string) {
			forgeContract(t, dst, func(c map[string]any) { c["output_scale"] = 0.5 })
		}, byteproof.MismatchContract, "moeprep.output_scale is 0.5, SRC's config gives absent"},
		{"contract activation", func(t *testing.T, dst string) {
			forgeContract(t, dst, func(c map[string]any) { c["activation"] = map[string]any{"limit": 7} })
		}, byteproof.MismatchContract, "moeprep.activation"},
		// copied files: byte for byte SRC's
		{"tokenizer_config.json chat template", func(t *testing.T, dst string) {
			replaceText(t, dst, "tokenizer_config.json", "m['content']", "m['content'] | reverse")
		}, byteproof.MismatchCopy, "tokenizer_config.json: copy differs at byte 58"},
		{"generation_config.json", func(t *testing.T, dst string) {
			replaceText(t, dst, "generation_config.json", `"eos_token_id": 1`, `"eos_token_id": 7`)
		}, byteproof.MismatchCopy, "generation_config.json: copy differs at byte"},
		{"generation_config.json longer", func(t *testing.T, dst string) {
			replaceText(t, dst, "generation_config.json", "}", "}\n ")
		}, byteproof.MismatchCopy, "DST's copy goes on"},
		{"a golden in a sub-directory", func(t *testing.T, dst string) {
			testkit.FlipBits(t, filepath.Join(dst, "reference", "moe-layer-1.safetensors"), -1, 1)
			rehash(t, dst, "reference/moe-layer-1.safetensors")
		}, byteproof.MismatchCopy, "reference/moe-layer-1.safetensors: copy differs"},
		// nothing in DST but what moeprep writes
		{"extra modeling file listed", func(t *testing.T, dst string) {
			testkit.WriteFile(t, filepath.Join(dst, "modeling_deepseek.py"), "import os\n")
			rehash(t, dst, "modeling_deepseek.py")
		}, byteproof.MismatchFile, "modeling_deepseek.py: file: listed in the manifest, but neither"},
		{"extra file not listed", func(t *testing.T, dst string) {
			testkit.WriteFile(t, filepath.Join(dst, "modeling_x.py"), "import os\n")
		}, byteproof.MismatchFile, "modeling_x.py: file: not listed in moeprep-manifest.json"},
		{"hidden file", func(t *testing.T, dst string) {
			testkit.WriteFile(t, filepath.Join(dst, ".env"), "X=1\n")
		}, byteproof.MismatchFile, ".env: file: not listed"},
		{"empty directory", func(t *testing.T, dst string) {
			if err := os.Mkdir(filepath.Join(dst, "extra"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, byteproof.MismatchFile, "extra: file: a directory holding no file the manifest lists"},
		{"symlink in DST", func(t *testing.T, dst string) {
			if err := os.Symlink(outside, filepath.Join(dst, "special_tokens_map.json")); err != nil {
				t.Fatal(err)
			}
		}, byteproof.MismatchFile, "special_tokens_map.json: file: a symbolic link"},
		{"a listed copy replaced by a symlink to the same bytes", func(t *testing.T, dst string) {
			replaceByLink(t, filepath.Join(dst, "generation_config.json"))
		}, byteproof.MismatchFile, "generation_config.json: file: a symbolic link"},
		{"a symlinked directory", func(t *testing.T, dst string) {
			replaceByLink(t, filepath.Join(dst, "reference"))
		}, byteproof.MismatchFile, "reference: file: a symbolic link, not a directory"},
		{"a FIFO", func(t *testing.T, dst string) {
			if err := syscall.Mkfifo(filepath.Join(dst, "pipe"), 0o644); err != nil {
				t.Skip("no FIFOs here:", err)
			}
		}, byteproof.MismatchFile, "pipe: file: a named pipe (FIFO)"},
		{"a listed copy replaced by a FIFO", func(t *testing.T, dst string) {
			p := filepath.Join(dst, "tokenizer_config.json")
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mkfifo(p, 0o644); err != nil {
				t.Skip("no FIFOs here:", err)
			}
		}, byteproof.MismatchFile, "tokenizer_config.json: file: a named pipe (FIFO)"},
		// the manifest's names (only the entry is asserted: layout.ReadManifest
		// may refuse such names itself, in its own words)
		{"manifest entry outside DST", func(t *testing.T, dst string) {
			if err := os.Symlink(outside, filepath.Join(filepath.Dir(dst), "outside")); err != nil {
				t.Fatal(err)
			}
			fi, err := layout.HashFile(outside)
			if err != nil {
				t.Fatal(err)
			}
			editManifest(t, dst, func(f map[string]layout.FileInfo) { f["../outside"] = fi })
		}, byteproof.MismatchManifest, "../outside"},
		{"manifest entry /dev/zero through ..", func(t *testing.T, dst string) {
			editManifest(t, dst, func(f map[string]layout.FileInfo) {
				f[up+"dev/zero"] = layout.FileInfo{Size: 1 << 40, SHA256: strings.Repeat("0", 64)}
			})
		}, byteproof.MismatchManifest, "../dev/zero"},
		{"manifest entry a real file outside through ..", func(t *testing.T, dst string) {
			editManifest(t, dst, func(f map[string]layout.FileInfo) { f[up+strings.TrimPrefix(host, "/")] = hostFI })
		}, byteproof.MismatchManifest, "../" + strings.TrimPrefix(host, "/")},
		{"manifest entry absolute", func(t *testing.T, dst string) {
			editManifest(t, dst, func(f map[string]layout.FileInfo) {
				f["/etc/hostname"] = layout.FileInfo{SHA256: strings.Repeat("0", 64)}
			})
		}, byteproof.MismatchManifest, "/etc/hostname"},
		{"manifest entry not clean", func(t *testing.T, dst string) {
			editManifest(t, dst, func(f map[string]layout.FileInfo) { f["reference/../config.json"] = f["config.json"] })
		}, byteproof.MismatchManifest, "reference/../config.json"},
		{"manifest lists a file DST lacks", func(t *testing.T, dst string) {
			editManifest(t, dst, func(f map[string]layout.FileInfo) { f["merges.txt"] = f["generation_config.json"] })
		}, byteproof.MismatchMissing, "merges.txt: missing: listed in moeprep-manifest.json, not in DST"},
		{"manifest is a symlink", func(t *testing.T, dst string) {
			p := filepath.Join(dst, layout.ManifestFileName)
			same := filepath.Join(t.TempDir(), layout.ManifestFileName)
			testkit.CopyFile(t, p, same)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(same, p); err != nil {
				t.Fatal(err)
			}
		}, byteproof.MismatchManifest, "moeprep-manifest.json: manifest: a symbolic link, not a regular file"},
		// every file of SRC copied
		{"a copied file missing", func(t *testing.T, dst string) {
			if err := os.Remove(filepath.Join(dst, "generation_config.json")); err != nil {
				t.Fatal(err)
			}
			editManifest(t, dst, func(f map[string]layout.FileInfo) { delete(f, "generation_config.json") })
		}, byteproof.MismatchFile, "generation_config.json: file: SRC has generation_config.json and DST does not"},
		{"a copied file missing, still listed", func(t *testing.T, dst string) {
			if err := os.Remove(filepath.Join(dst, "tokenizer_config.json")); err != nil {
				t.Fatal(err)
			}
		}, byteproof.MismatchMissing, "tokenizer_config.json: missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertInto(t, src, convert.Options{FuseShared: true, TP: 2})
			o := Options{Src: src, Dst: dst, Bytes: BytesOnly}
			if rep, err := runBounded(t, o); err != nil || rep.Failed() {
				t.Fatalf("the untampered output does not pass: %v %v", err, rep.Err())
			}
			tc.mutate(t, dst)
			rep, err := runBounded(t, o)
			if err != nil {
				t.Fatalf("an error (exit %d) instead of a failed check: %v", exitcode.Code(err), err)
			}
			if tc.kind == "" {
				if rep.Failed() {
					t.Fatalf("fails: %v", rep.Err())
				}
				return
			}
			if exitcode.Code(rep.Err()) != exitcode.CheckFailed || rep.Bytes == nil || rep.Bytes.Mismatch == nil {
				t.Fatalf("not caught: %+v", rep.Bytes)
			}
			m := rep.Bytes.Mismatch
			if m.Kind != tc.kind || !strings.Contains(m.Error(), tc.want) || !strings.Contains(rep.Err().Error(), tc.want) {
				t.Fatalf("got %s: %s; want kind %q and %q", m.Kind, m.Error(), tc.kind, tc.want)
			}
			if strings.Contains(m.Error(), hostFI.SHA256) {
				t.Errorf("the hash of %s, outside DST, was computed: %s", host, m.Error())
			}
			if strings.Contains(m.Error(), "\n") {
				t.Errorf("not one line: %q", m.Error())
			}
			t.Logf("caught: %s", m.Error())
		})
	}
}

// replaceByLink moves the file or directory p out of DST and leaves at p a
// symbolic link to it: the same bytes, through a link.
func replaceByLink(t *testing.T, p string) {
	t.Helper()
	same := filepath.Join(t.TempDir(), filepath.Base(p))
	if err := os.Rename(p, same); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(same, p); err != nil {
		t.Fatal(err)
	}
}

// TestDirectoryProofFullRun: `validate SRC DST` (the layer checks, then the
// proof) fails a tampered config and a forged contract with exit 1 too: the
// layers agree, the proof does not. A forged routed_scaling_factor makes
// DST another model than SRC: the layer checks cannot run, the proof says
// why (and without the proof, the check that found it).
func TestDirectoryProofFullRun(t *testing.T) {
	src := dirSource(t)
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, dst string)
		kind   string
		want   string
		rows   bool // the layer checks ran
	}{
		{"config", func(t *testing.T, dst string) {
			replaceText(t, dst, "config.json", `"rms_norm_eps": 1e-06`, `"rms_norm_eps": 1e-05`)
		}, byteproof.MismatchConfig, "rms_norm_eps is 1e-06 in SRC, 1e-05 in DST", true},
		{"chat template", func(t *testing.T, dst string) {
			replaceText(t, dst, "tokenizer_config.json", "{% endfor %}", "{% endfor %}!")
		}, byteproof.MismatchCopy, "tokenizer_config.json", true},
		{"rsf", func(t *testing.T, dst string) {
			forgeContract(t, dst, func(c map[string]any) { c["routed_scaling_factor"] = 1.0; c["shared_slot_weight"] = 1.0 })
		}, byteproof.MismatchContract, "moeprep.routed_scaling_factor is 1, SRC's config gives 2.5", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertInto(t, src, convert.Options{FuseShared: true, TP: 1})
			tc.mutate(t, dst)
			rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Layers: "1", Tokens: 8, Seed: 1})
			if err != nil {
				t.Fatalf("an error instead of a failed check: %v", err)
			}
			if exitcode.Code(rep.Err()) != exitcode.CheckFailed || rep.Bytes == nil || rep.Bytes.Mismatch == nil {
				t.Fatalf("not caught: %v", rep.Err())
			}
			if m := rep.Bytes.Mismatch; m.Kind != tc.kind || !strings.Contains(m.Error(), tc.want) {
				t.Fatalf("got %s; want kind %q and %q", m.Error(), tc.kind, tc.want)
			}
			if (len(rep.Rows) > 0) != tc.rows {
				t.Fatalf("%d layer rows, want rows %v", len(rep.Rows), tc.rows)
			}
			var b jsonBuf
			if err := rep.WriteTable(&b); err != nil || !strings.Contains(b.String(), "bytes: FAIL: ") {
				t.Fatalf("table: %v\n%s", err, b)
			}
		})
	}
	// --skip-bytes: no proof names the key, but DST is still not SRC's
	// model, which is a failed check (exit 1) naming what differs.
	dst := convertInto(t, src, convert.Options{FuseShared: true, TP: 1})
	forgeContract(t, dst, func(c map[string]any) { c["routed_scaling_factor"] = 1.0; c["shared_slot_weight"] = 1.0 })
	if _, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOff}); exitcode.Code(err) != exitcode.CheckFailed || !strings.Contains(err.Error(), "rsf 1; SRC has 16, rsf 2.5") {
		t.Fatalf("--skip-bytes: %v, want exit 1 naming rsf", err)
	}
}

// TestFoldMaxRelChangeStated: a folded output's fold_max_rel_change must be
// what its bytes show, neither less (a fold error hidden) nor more (a
// forged figure).
func TestFoldMaxRelChangeStated(t *testing.T) {
	src := filepath.Join(hfFixtures, "deepseek-v3-fp8")
	for _, tc := range []struct {
		factor float64
		kind   string
	}{{1, ""}, {0.5, byteproof.MismatchFold}, {2, byteproof.MismatchContract}} {
		dst := convertInto(t, src, convert.Options{FuseShared: true, TP: 2})
		var stated float64
		forgeContract(t, dst, func(c map[string]any) {
			stated = c["fold_max_rel_change"].(float64)
			c["fold_max_rel_change"] = stated * tc.factor
		})
		if stated == 0 {
			t.Fatal("nothing folded: the test needs a folded output")
		}
		rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Bytes: BytesOnly})
		if err != nil {
			t.Fatal(err)
		}
		switch m := rep.Bytes.Mismatch; {
		case tc.kind == "" && m != nil:
			t.Errorf("x%g: %s", tc.factor, m.Error())
		case tc.kind != "" && (m == nil || m.Kind != tc.kind || !strings.Contains(m.Error(), "fold_max_rel_change")):
			t.Errorf("x%g: %+v, want kind %s", tc.factor, m, tc.kind)
		}
	}
}

// TestSrcSymlinkedFiles: a SRC from a hub cache, whose snapshot files are
// links into blobs/, is compared through the links: the genuine output
// passes, and a blob that differs from DST's copy fails naming it.
func TestSrcSymlinkedFiles(t *testing.T) {
	src := dirSource(t)
	blob := filepath.Join(t.TempDir(), "blobs", "3f2a")
	p := filepath.Join(src, "tokenizer_config.json")
	testkit.CopyFile(t, p, blob)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(blob, p); err != nil {
		t.Fatal(err)
	}
	others, err := cktest.Open(t, src).OtherFiles()
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, f := range others {
		listed = listed || f == "tokenizer_config.json"
	}
	if !listed {
		t.Skip("checkpoint.OtherFiles does not list linked files yet: convert does not copy them")
	}
	dst := convertInto(t, src, convert.Options{})
	if _, err := os.Lstat(filepath.Join(dst, "tokenizer_config.json")); err != nil {
		t.Fatalf("convert did not copy the linked file: %v", err)
	}
	o := Options{Src: src, Dst: dst, Bytes: BytesOnly}
	if rep, err := Run(context.Background(), o); err != nil || rep.Failed() {
		t.Fatalf("the genuine output fails: %v %v", err, rep.Err())
	}
	testkit.WriteFile(t, blob, `{"chat_template": ""}`+"\n")
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if m := rep.Bytes.Mismatch; m == nil || m.Kind != byteproof.MismatchCopy || !strings.Contains(m.File, "tokenizer_config.json") {
		t.Fatalf("a changed blob: %+v", m)
	}
}
