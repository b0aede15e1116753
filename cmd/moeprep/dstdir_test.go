package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// DST as rclone and hf download --local-dir take it: an empty directory is
// filled, missing parents are made; a directory holding anything, or a
// path through a file, is still refused.
func TestConvertDestinations(t *testing.T) {
	src := filepath.Join("..", "..", "fixtures", "hf", "qwen3-moe")
	base := t.TempDir()
	empty := filepath.Join(base, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(base, "full")
	if err := os.MkdirAll(full, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(full, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dst  string
		code int
		want string
	}{
		{empty, 0, "wrote " + empty},
		{filepath.Join(base, "a", "b", "out"), 0, "wrote " + filepath.Join(base, "a", "b", "out")},
		{full, 2, "full: already exists"},
		{filepath.Join(file, "out"), 2, "cannot create the output directory"},
	} {
		code, out, errOut := runCLI(t, "convert", "-q", src, tc.dst)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%s: exit %d, %s%s; want %d and %q", tc.dst, code, out, errOut, tc.code, tc.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(full, "notes.txt")); err != nil || string(b) != "mine" {
		t.Errorf("the refused DST's file: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(empty, "config.json")); err != nil {
		t.Errorf("the empty DST was not filled: %v", err)
	}
	// Rerunning a finished convert says how to check it instead.
	code, _, errOut := runCLI(t, "convert", "-q", src, empty)
	if code != 2 || !strings.Contains(errOut, "already exists and is moeprep output; --resume checks it against this run's plan") {
		t.Errorf("rerun: exit %d, %s", code, errOut)
	}
	if code, out, errOut := runCLI(t, "convert", "--resume", src, empty); code != 0 || !strings.Contains(out, "is already complete") {
		t.Errorf("--resume of the finished run: exit %d\n%s\n%s", code, out, errOut)
	}
}
