package redteam

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// hubFiles are the files of a hub checkpoint besides the weights and their
// index, as a hub download has them; convert copies each one as it is.
var hubFiles = map[string]string{
	"tokenizer.json":      `{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}` + "\n",
	"chat_template.jinja": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}\n",
	"modeling_x.py":       "# custom modeling code a hub repo ships for trust_remote_code\nclass X: pass\n",
	"README.md":           "---\nlicense: mit\n---\n# tiny\n",
}

// copiedFiles are what DST must hold byte for byte from SRC.
var copiedFiles = []string{"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
	"generation_config.json", "modeling_x.py", "README.md"}

// TestHubSnapshot: SRC reached through links, as the hub cache lays it out
// (issue 26, case 17). In models--org--name/snapshots/REV/ every file is a
// relative link into ../../blobs/<hash>. convert must copy what the links
// point to, as regular files; validate must pass on the pair, and fail once
// a copied file is changed in DST (its manifest entry rewritten to match).
func TestHubSnapshot(t *testing.T) {
	plain := sharedDir(t, "tiny-sharded", func(dir string) {
		// Two shards and an index, so the index is a link too.
		synth(t, dir, append(append([]string{}, tinyArgs...), "--shard-size", "500KB")...)
		for name, content := range hubFiles {
			testkit.WriteFile(t, filepath.Join(dir, name), []byte(content))
		}
	})
	cases := []struct {
		name string
		src  func(t *testing.T, dir string) string
	}{
		{"SRC a link to a directory", func(t *testing.T, dir string) string {
			link := filepath.Join(dir, "latest")
			if err := os.Symlink(plain, link); err != nil {
				t.Fatal(err)
			}
			return link
		}},
		{"SRC a hub cache snapshot", func(t *testing.T, dir string) string {
			return hubSnapshot(t, plain, filepath.Join(dir, "hub", "models--org--tiny"), "0123456789abcdef0123456789abcdef01234567")
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			src := c.src(t, dir)
			before, beforePlain := snapshot(t, dir), snapshot(t, plain)
			dst := filepath.Join(dir, "out")
			check(t, runMoeprep(t, caseTimeout, "convert", "--no-progress", src, dst), code(0, nil, ""))
			if t.Failed() {
				return
			}
			// Nothing written through the links: the blobs, the snapshot's
			// links and the linked-to directory are as they were.
			after := snapshot(t, dir)
			for p := range after {
				if p == "out" || filepath.Dir(p) == "out" {
					delete(after, p)
				}
			}
			assertSameMaps(t, dir, before, after)
			assertUnchanged(t, plain, beforePlain)

			for _, name := range append([]string{"config.json"}, copiedFiles...) {
				st, err := os.Lstat(filepath.Join(dst, name))
				if err != nil || !st.Mode().IsRegular() {
					t.Errorf("DST %s: not a regular file (%v)", name, err)
				}
			}
			for _, name := range copiedFiles {
				if err := sameFiles(filepath.Join(plain, name), filepath.Join(dst, name)); err != nil {
					t.Errorf("DST %s is not SRC's: %v", name, err)
				}
			}
			for _, run := range [][]string{validateBytes, validateFull} {
				check(t, runMoeprep(t, caseTimeout, append(append([]string{}, run...), src, dst)...), code(0, nil, ""))
			}

			testkit.WriteFile(t, filepath.Join(dst, "tokenizer.json"), []byte(`{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 1, "b": 0}, "merges": []}}`+"\n"))
			rehash(t, dst, "tokenizer.json")
			for _, run := range [][]string{validateBytes, validateFull} {
				check(t, runMoeprep(t, caseTimeout, append(append([]string{}, run...), src, dst)...), code(1, names("tokenizer.json"), ""))
			}
		})
	}
}

// hubSnapshot lays plain's files out as the hub cache does under repo:
// blobs/<sha256> holding each file's bytes, snapshots/<rev>/<name> a
// relative link to its blob, refs/main naming rev. It returns the snapshot.
func hubSnapshot(t *testing.T, plain, repo, rev string) string {
	t.Helper()
	snap := filepath.Join(repo, "snapshots", rev)
	ents, err := os.ReadDir(plain)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b := testkit.ReadFile(t, filepath.Join(plain, e.Name()))
		sum := sha256.Sum256(b)
		blob := hex.EncodeToString(sum[:])
		testkit.WriteFile(t, filepath.Join(repo, "blobs", blob), b)
		if err := os.MkdirAll(snap, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", blob), filepath.Join(snap, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WriteFile(t, filepath.Join(repo, "refs", "main"), []byte(rev))
	return snap
}

// assertSameMaps fails for every key whose value differs.
func assertSameMaps(t *testing.T, what string, want, got tree) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s changed: %q, was %q", what, k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: %s appeared", what, k)
		}
	}
}
