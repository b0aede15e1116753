package dirlock

import (
	"os"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// A second open of the same directory cannot take the lock until the first
// is closed (flock locks belong to the open file, even in one process).
func TestLockExcludes(t *testing.T) {
	dir := t.TempDir()
	a, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if busy, err := Lock(a); busy || err != nil {
		t.Fatalf("first lock: busy %v, %v", busy, err)
	}
	b := testkit.Open(t, dir)
	if busy, err := Lock(b); !busy || err != nil {
		t.Fatalf("second lock while the first is held: busy %v, %v", busy, err)
	}
	a.Close()
	if busy, err := Lock(b); busy || err != nil {
		t.Fatalf("after the first is closed: busy %v, %v", busy, err)
	}
}
