package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// A model named as hf users name it (org/name, or the cache's
// models--org--name folder) is read from the cached snapshot refs/main
// names, with a line saying which; a name in no cache says how to get it.
func TestHuggingFacePaths(t *testing.T) {
	cache := testkit.HubCache(t)
	const commit = "0123456789abcdef0123456789abcdef01234567"
	repo := filepath.Join(cache, "models--mistralai--Mixtral-tiny")
	snap := filepath.Join(repo, "snapshots", commit)
	testkit.CopyDir(t, filepath.Join("..", "..", "fixtures", "hf", "mixtral"), snap)
	testkit.WriteFile(t, filepath.Join(repo, "refs", "main"), []byte(commit))
	note := "mistralai/Mixtral-tiny: the Hugging Face cache's snapshot " + commit + " (refs/main): " + snap
	// The next: lines name the model as it was typed, so the step reads as
	// the user wrote it and resolves to the same snapshot.
	for _, arg := range []string{"mistralai/Mixtral-tiny", repo} {
		code, out, errOut := runCLI(t, "inspect", arg)
		if code != 0 || !strings.Contains(out, "mixtral") || !strings.Contains(errOut, "inspect: reading "+note) ||
			!strings.Contains(out, "moeprep convert --layout transformers "+arg+" OUT") {
			t.Fatalf("inspect %s: exit %d\n%s\n%s", arg, code, out, errOut)
		}
	}
	if code, out, _ := runCLI(t, "inspect", "--revision", "main", "mistralai/Mixtral-tiny"); code != 0 || !strings.Contains(out, "moeprep convert --layout transformers --revision main mistralai/Mixtral-tiny OUT") {
		t.Fatalf("inspect --revision main: exit %d\n%s", code, out)
	}
	dst := filepath.Join(t.TempDir(), "out")
	if code, out, errOut := runCLI(t, "convert", "mistralai/Mixtral-tiny", dst); code != 0 || !strings.Contains(errOut, "convert: reading "+note) ||
		!strings.Contains(out, "next: moeprep validate mistralai/Mixtral-tiny "+dst) {
		t.Fatalf("convert: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, errOut := runCLI(t, "validate", "--device", "cpu", "-q", "mistralai/Mixtral-tiny", dst); code != 0 || !strings.Contains(errOut, "validate: reading "+note) {
		t.Fatalf("validate: exit %d\n%s\n%s", code, out, errOut)
	}
	code, _, errOut := runCLI(t, "inspect", "mistralai/Mixtral-8x7B")
	if code != 2 || !strings.Contains(errOut, "mistralai/Mixtral-8x7B: no such directory, nor a model in the Hugging Face cache ("+cache+"); moeprep never downloads: run `hf download mistralai/Mixtral-8x7B` first") {
		t.Errorf("not cached: exit %d, %s", code, errOut)
	}
	code, _, errOut = runCLI(t, "inspect", "--revision", "v9", "mistralai/Mixtral-tiny")
	if code != 2 || !strings.Contains(errOut, `no snapshot for revision "v9"`) {
		t.Errorf("--revision v9: exit %d, %s", code, errOut)
	}
}
