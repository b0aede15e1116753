package progress

import (
	"bytes"
	"path/filepath"
	"sync"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Every command reports in one style: New is a Status (validate's), or
// nothing at all when disabled.
func TestNewIsStatus(t *testing.T) {
	f := testkit.Create(t, filepath.Join(t.TempDir(), "log"))
	for _, tt := range []struct {
		disabled bool
		want     string
	}{{false, "*progress.Status"}, {true, "progress.Discard"}} {
		r := New(f, "convert", tt.disabled)
		got := "other"
		switch r.(type) {
		case *Status:
			got = "*progress.Status"
		case Discard:
			got = "progress.Discard"
		}
		r.Done()
		if got != tt.want {
			t.Errorf("New(disabled=%v) = %s, want %s", tt.disabled, got, tt.want)
		}
	}
}
