package hfcache

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// A cache laid out as huggingface_hub lays it out: refs/main and a tag
// naming snapshots, and a plain checkpoint folder beside it.
func TestResolve(t *testing.T) {
	cache := testkit.HubCache(t)
	repo := filepath.Join(cache, "models--deepseek-ai--DeepSeek-V3")
	const main, tag = "0123456789abcdef0123456789abcdef01234567", "fedcba9876543210fedcba9876543210fedcba98"
	testkit.WriteFile(t, filepath.Join(repo, "refs", "main"), main+"\n")
	testkit.WriteFile(t, filepath.Join(repo, "refs", "v1"), tag)
	testkit.WriteFile(t, filepath.Join(repo, "snapshots", main, "config.json"), "{}")
	testkit.WriteFile(t, filepath.Join(repo, "snapshots", tag, "config.json"), "{}")
	plain := filepath.Join(t.TempDir(), "ckpt")
	testkit.WriteFile(t, filepath.Join(plain, "config.json"), "{}")
	for _, tc := range []struct {
		arg, rev string
		dir      string // want; "" for an error
		note     string
		err      string
	}{
		{"deepseek-ai/DeepSeek-V3", "", filepath.Join(repo, "snapshots", main), "deepseek-ai/DeepSeek-V3: the Hugging Face cache's snapshot " + main + " (refs/main)", ""},
		{"deepseek-ai/DeepSeek-V3", "v1", filepath.Join(repo, "snapshots", tag), "refs/v1", ""},
		{"deepseek-ai/DeepSeek-V3", tag, filepath.Join(repo, "snapshots", tag), "", ""},
		{repo, "", filepath.Join(repo, "snapshots", main), "deepseek-ai/DeepSeek-V3: the Hugging Face cache's snapshot", ""},
		{plain, "", plain, "", ""},
		{"./not/here", "", "./not/here", "", ""},
		{"a/b/c", "", "a/b/c", "", ""},
		{"Qwen/Qwen3-30B-A3B", "", "", "", "Qwen/Qwen3-30B-A3B: no such directory, nor a model in the Hugging Face cache (" + cache + "); moeprep never downloads: run `hf download Qwen/Qwen3-30B-A3B` first"},
		{"deepseek-ai/DeepSeek-V3", "v2", "", "", "no snapshot for revision \"v2\" (snapshots: " + main + ", " + tag + "); moeprep never downloads: run `hf download deepseek-ai/DeepSeek-V3 --revision v2`"},
		{"deepseek-ai/DeepSeek-V3", "../../etc", "", "", `--revision "../../etc" is not a branch, tag or commit name`},
	} {
		r, err := Resolve(tc.arg, tc.rev)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s@%s: got %v, want an error with %q", tc.arg, tc.rev, err, tc.err)
			}
			continue
		}
		if err != nil || r.Dir != tc.dir || !strings.Contains(r.Note(), tc.note) {
			t.Errorf("%s@%s: %+v %v; want dir %s, note with %q", tc.arg, tc.rev, r, err, tc.dir, tc.note)
		}
	}
	// A ref naming something that is not a snapshot folder is refused.
	testkit.WriteFile(t, filepath.Join(repo, "refs", "bad"), "../../../../etc")
	if _, err := Resolve("deepseek-ai/DeepSeek-V3", "bad"); err == nil || !strings.Contains(err.Error(), "does not name a snapshot") {
		t.Errorf("hostile ref: %v", err)
	}
}

func TestDir(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", "/x/hf")
	if d := Dir(); d != "/x/hf/hub" {
		t.Errorf("HF_HOME: %s", d)
	}
	t.Setenv("HF_HOME", "")
	t.Setenv("XDG_CACHE_HOME", "/x/cache")
	if d := Dir(); d != "/x/cache/huggingface/hub" {
		t.Errorf("XDG_CACHE_HOME: %s", d)
	}
}
