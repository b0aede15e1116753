package progress

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestLinesPrintsFraction(t *testing.T) {
	var buf syncBuf
	l := NewLines(&buf, "convert", 10*time.Millisecond)
	l.Total(4 << 20)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); l.Add(1 << 20) }()
	}
	wg.Wait()
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(buf.String(), "4.19 MB of 4.19 MB (100%)") {
		if time.Now().After(deadline) {
			t.Fatalf("no complete progress line, got %q", buf.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.Done()
	if !strings.HasPrefix(buf.String(), "convert: ") {
		t.Fatalf("line should start with the label: %q", buf.String())
	}
}
