package redteam

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// validateFull and validateBytes are the two validate runs of a SRC DST
// pair: the layer checks plus the structural proof, and the proof alone.
var (
	validateFull  = []string{"validate", "--no-progress", "--device", "cpu"}
	validateBytes = []string{"validate", "--no-progress", "--bytes"}
)

// TestTamper: validate must not certify a DST an attacker changed and then
// made consistent with its manifest (issue 26, cases 7-11). The manifest is
// unsigned, so the attacker rewrites the changed file's entry (rehash): the
// proof has to come from SRC and the contract, not from the manifest.
func TestTamper(t *testing.T) {
	src := tinySrc(t)
	fused := tinyFused(t)
	full, bytesOnly := validateFull, validateBytes
	both := [][]string{full, bytesOnly}
	cases := []struct {
		name   string
		tamper func(t *testing.T, dst string)
		runs   [][]string // validate command lines, before SRC DST
		want   expect
	}{
		// Controls: the untouched output passes, and a change the attacker
		// does not hide is caught; without these a failing tamper case
		// could be a broken fixture.
		{"control: untouched", func(*testing.T, string) {}, both, code(0, nil, "")},
		{"control: tokenizer_config.json changed, manifest not rewritten", func(t *testing.T, dst string) {
			testkit.WriteFile(t, filepath.Join(dst, "tokenizer_config.json"), []byte(`{"model_max_length": 1}`+"\n"))
		}, both, code(1, names("tokenizer_config.json"), "")},

		// Case 7: config.json fields outside the MoE block change what the
		// model computes (norm epsilon, vocabulary, when it stops).
		{"config.json rms_norm_eps", configEdit("rms_norm_eps", 1e-5), both, code(1, names("config.json"), "rms_norm_eps")},
		{"config.json vocab_size", configEdit("vocab_size", 129), both, code(1, names("config.json"), "vocab_size")},
		{"config.json eos_token_id", configEdit("eos_token_id", 2), both, code(1, names("config.json"), "eos_token_id")},
		{"config.json new field", configEdit("rope_scaling", map[string]any{"type": "yarn", "factor": 40}), both, code(1, names("config.json"), "rope_scaling")},

		// Case 8: the copied tokenizer and generation files.
		{"tokenizer_config.json", fileEdit("tokenizer_config.json", `{"model_max_length": 1, "chat_template": "{{ 'owned' }}"}`+"\n"), both,
			code(1, names("tokenizer_config.json"), "")},
		{"generation_config.json", fileEdit("generation_config.json", `{"eos_token_id": 7, "temperature": 9.0}`+"\n"), both,
			code(1, names("generation_config.json"), "")},

		// Case 9: code that trust_remote_code would run, added to DST.
		{"modeling_deepseek.py added and listed", func(t *testing.T, dst string) {
			testkit.WriteFile(t, filepath.Join(dst, "modeling_deepseek.py"), []byte("import os\nos.system('id')\n"))
			rehash(t, dst, "modeling_deepseek.py")
		}, both, code(1, names("modeling_deepseek.py"), "")},
		{"modeling_deepseek.py added, not listed", func(t *testing.T, dst string) {
			testkit.WriteFile(t, filepath.Join(dst, "modeling_deepseek.py"), []byte("import os\nos.system('id')\n"))
		}, both, code(1, names("modeling_deepseek.py"), "")},

		// Case 10: the contract's shared slot weight (1/rsf here: bf16 is not
		// folded) is what an engine multiplies the shared expert by.
		{"contract shared_slot_weight", func(t *testing.T, dst string) {
			cfg := filepath.Join(dst, "config.json")
			testkit.EditJSON(t, cfg, func(m map[string]any) {
				c, ok := m["moeprep"].(map[string]any)
				if !ok {
					t.Fatalf("%s: no moeprep contract", cfg)
				}
				c["shared_slot_weight"] = 1.0
			})
			rehash(t, dst, "config.json")
		}, [][]string{bytesOnly}, code(1, names("config.json"), "shared_slot_weight")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			testkit.CopyDir(t, fused, dst)
			c.tamper(t, dst)
			for _, run := range c.runs {
				check(t, runMoeprep(t, caseTimeout, append(append([]string{}, run...), src, dst)...), c.want)
			}
		})
	}
}

// configEdit sets DST config.json's key to v and rehashes it.
func configEdit(key string, v any) func(t *testing.T, dst string) {
	return func(t *testing.T, dst string) {
		testkit.EditJSON(t, filepath.Join(dst, "config.json"), func(m map[string]any) { m[key] = v })
		rehash(t, dst, "config.json")
	}
}

// fileEdit replaces DST's file name with content and rehashes it.
func fileEdit(name, content string) func(t *testing.T, dst string) {
	return func(t *testing.T, dst string) {
		if _, err := os.Stat(filepath.Join(dst, name)); err != nil {
			t.Fatalf("the fixture has no %s to change: %v", name, err)
		}
		testkit.WriteFile(t, filepath.Join(dst, name), []byte(content))
		rehash(t, dst, name)
	}
}

// TestManifestEscape: manifest entries that point outside DST (issue 26,
// case 11). validate must refuse them quickly (exit 1 or 2), neither hang
// on an endless device nor read another file and print its size or hash.
func TestManifestEscape(t *testing.T) {
	src := tinySrc(t)
	fused := tinyFused(t)
	hostname, hostSum := "/etc/hostname", ""
	hostInfo, err := os.Stat(hostname)
	if err == nil {
		hostSum, err = sha256File(hostname)
	}
	if err != nil {
		t.Logf("no readable %s (%v): its cases check only the exit code", hostname, err)
	}
	cases := []struct {
		name  string
		entry func(up string) (string, any) // up: the ../ that reach / from DST
		skip  bool
	}{
		{"dev/zero, endless", func(up string) (string, any) {
			return up + "dev/zero", map[string]any{"size": int64(1) << 40, "sha256": strings.Repeat("0", 64)}
		}, false},
		{"etc/hostname, wrong hash", func(up string) (string, any) {
			return up + "etc/hostname", map[string]any{"size": 1, "sha256": strings.Repeat("0", 64)}
		}, hostSum == ""},
		{"etc/hostname, its real hash", func(up string) (string, any) {
			return up + "etc/hostname", map[string]any{"size": hostInfo.Size(), "sha256": hostSum}
		}, hostSum == ""},
		{"absolute /etc/hostname", func(string) (string, any) {
			return "/etc/hostname", map[string]any{"size": 1, "sha256": strings.Repeat("0", 64)}
		}, hostSum == ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.skip {
				t.Skip("no /etc/hostname to read")
			}
			dst := filepath.Join(t.TempDir(), "dst")
			testkit.CopyDir(t, fused, dst)
			// As many ../ as DST is deep, at least the four: the path
			// really resolves to the file from DST.
			up := strings.Repeat("../", max(4, strings.Count(filepath.Clean(dst), string(filepath.Separator))))
			name, entry := c.entry(up)
			editManifest(t, dst, func(files map[string]any) { files[name] = entry })
			// Where the entry holds the real hash, printing it leaks nothing
			// the manifest did not say.
			leakCheck := hostSum != "" && entry.(map[string]any)["sha256"] != hostSum
			for _, run := range [][]string{validateBytes, validateFull} {
				r := runMoeprep(t, caseTimeout, append(append([]string{}, run...), src, dst)...)
				check(t, r, expect{codes: []int{1, 2}, names: names(manifestName, name)})
				if leakCheck {
					for _, leak := range []string{hostSum, hostSum[:16]} {
						if strings.Contains(r.stdout+r.stderr, leak) {
							t.Errorf("the output carries %s's SHA-256 %s", hostname, hostSum)
						}
					}
				}
			}
		})
	}
}
