package inspect

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/progress"
)

// ReadStats is what reading every tensor end to end measured.
type ReadStats struct {
	Tensors int     `json:"tensors_read"`
	Bytes   int64   `json:"bytes_read"`
	Seconds float64 `json:"read_seconds"`
	GBps    float64 `json:"read_gb_per_s"`
}

// ReadEveryTensor streams every tensor's bytes through one bounded buffer,
// proving each byte range can be read, whatever the checkpoint's size: memory
// stays at the buffer plus the headers.
func ReadEveryTensor(ctx context.Context, c *checkpoint.Checkpoint, rep progress.Reporter) (*ReadStats, error) {
	start := time.Now()
	rep.Total(c.TotalBytes())
	buf := make([]byte, 1<<20)
	st := &ReadStats{}
	for _, t := range c.Tensors {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r := t.Reader()
		for {
			n, err := r.Read(buf)
			st.Bytes += int64(n)
			rep.Add(int64(n))
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("%s: reading tensor %s: %w", t.File, t.Name, err)
			}
		}
		st.Tensors++
	}
	st.Seconds = time.Since(start).Seconds()
	if st.Seconds > 0 {
		st.GBps = float64(st.Bytes) / st.Seconds / 1e9
	}
	return st, nil
}
