package safeio

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

func TestOpenRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(reg, []byte(`{"a":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFOs here: %v", err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(reg, link); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path    string
		wantErr string // "" means success
	}{
		{reg, ""},
		{link, ""}, // links are followed
		{fifo, "named pipe"},
		{dir, "a directory"},
		{"/dev/zero", "character device"},
		{filepath.Join(dir, "missing"), "no such file"},
	}
	for _, c := range cases {
		_, err := testkit.Within(t, c.path+": ReadFile", func() ([]byte, error) { return ReadFile(c.path, 1<<20, "a config") })
		if c.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", c.path, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), c.path) {
			t.Errorf("%s: error %v, want one naming the path and %q", c.path, err, c.wantErr)
		}
	}
}

func TestReadFileSizeLimit(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "big.json")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: 1 GiB claimed, nothing held. The limit must be checked
	// before a byte is read.
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = ReadFile(p, 16<<20, "an index")
	if err == nil || !strings.Contains(err.Error(), "1073741824 bytes, over the 16777216-byte limit for an index") {
		t.Fatalf("got %v", err)
	}
	small := filepath.Join(dir, "small.json")
	if err := os.WriteFile(small, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(small, 10, "a file"); err != nil || string(b) != "0123456789" {
		t.Fatalf("at the limit: %q, %v", b, err)
	}
	if _, err := ReadFile(small, 9, "a file"); err == nil {
		t.Fatal("one byte over the limit was read")
	}
}
