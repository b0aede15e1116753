package convert

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/moeprep/moeprep/internal/safeio"
)

// Plan is what --dry-run reports: the output convert or fuse-shared would
// write, what it would read and write, whether it fits, and how long it
// would take at the speed SRC's disk was just measured to read.
type Plan struct {
	Src    string `json:"src"`
	Dst    string `json:"dst"`
	Layout string `json:"layout"`
	// Orientation: as Summary's.
	Orientation string `json:"orientation,omitempty"`
	Tensors     int    `json:"tensors"` // output tensors
	// MoELayers is the number of MoE layers whose experts are stacked.
	MoELayers   int  `json:"moe_layers"`
	FusedShared int  `json:"num_fused_shared_experts"`
	Folded      bool `json:"routed_scaling_factor_folded"`
	// SharedRequantized is the format the shared expert is requantised
	// into (--requantize-shared); "" when it is not.
	SharedRequantized string      `json:"shared_requantized,omitempty"`
	Shards            []PlanShard `json:"shards"`
	// Ranks and RankBytes: a per-rank output's N*M ranks and each one's
	// expert files' bytes (the shared files, every rank's too, are the
	// shards outside the rank directories); absent without --ep.
	Ranks       int     `json:"ranks,omitempty"`
	RankBytes   []int64 `json:"rank_bytes,omitempty"`
	CopiedFiles int     `json:"copied_files"`
	// Copied are the files copied as they are, largest first; Excluded
	// those --exclude leaves out (slash-separated, relative to SRC).
	Copied     []CopiedFile `json:"copied"`
	Excluded   []string     `json:"excluded_files,omitempty"`
	ReadBytes  int64        `json:"read_bytes"`  // from SRC: every tensor once, every copied file
	WriteBytes int64        `json:"write_bytes"` // shards and copies (the index, config and manifest are a few MB more)
	// FreeBytes is the space available on DST's file system, -1 unknown.
	FreeBytes int64 `json:"free_bytes"`
	Fits      bool  `json:"fits"`
	// ReadRate is bytes per second read from SRC's largest weight file for
	// up to RateSampleSeconds, with O_DIRECT where the file system allows
	// (so the page cache does not flatter the disk); 0 when not measured.
	ReadRate          float64 `json:"read_rate_bytes_per_s"`
	RateSampleSeconds float64 `json:"rate_sample_seconds"`
	RateDirect        bool    `json:"rate_direct_io"`
	// EstimatedSeconds is ReadBytes / ReadRate: a run reads every byte of
	// SRC once and writes while it reads, so the read is its floor. With
	// --dtype the output is larger than what is read: the larger of the
	// two at that rate.
	EstimatedSeconds float64 `json:"estimated_seconds"`
	// DType and DequantizedTensors: with --dtype, the dtype the quantised
	// weights are dequantised into and how many are (absent without).
	DType              string `json:"dtype,omitempty"`
	DequantizedTensors int    `json:"dequantized_tensors,omitempty"`
	// Notices: as Summary's.
	Notices []string `json:"notices,omitempty"`
}

// CopiedFile is a file of SRC copied as it is, with its size.
type CopiedFile struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}

// PlanShard is one output shard of the plan.
type PlanShard struct {
	Name    string `json:"name"`
	Bytes   int64  `json:"bytes"`
	Tensors int    `json:"tensors"`
}

// DryRun plans the run Convert would make, checks the destination rules
// (it refuses what Convert would refuse), measures SRC's read speed, and
// writes nothing.
func DryRun(ctx context.Context, o Options) (*Plan, error) {
	w, err := prepare(&o)
	if err != nil {
		return nil, err
	}
	defer w.ck.Close()
	if !(o.Resume && exists(w.dst)) {
		if err := checkReplaceable(w.dst, o.Dst, o.Force); err != nil {
			return nil, err
		}
	}
	p := &Plan{Src: w.src, Dst: w.dst, Layout: string(o.Layout), Orientation: string(w.op.contract.Orientation), MoELayers: len(w.op.contract.Layers),
		FusedShared: w.op.contract.NumFusedSharedExperts, Folded: w.op.contract.RoutedScalingFactorFolded,
		SharedRequantized: requantizedInto(w.op.contract), Tensors: len(w.op.tensors), CopiedFiles: len(w.others), Notices: w.notices}
	p.DType, p.DequantizedTensors = dequantSummary(w.op.contract)
	p.Ranks, p.RankBytes = w.op.contract.Ranks(), w.op.rankBytes()
	for _, s := range w.op.shards {
		p.Shards = append(p.Shards, PlanShard{Name: s.name, Bytes: s.size, Tensors: len(s.tensors)})
		p.WriteBytes += s.size
	}
	p.ReadBytes = w.ck.TotalBytes()
	p.Copied = copiedFiles(w.src, w.others)
	for _, c := range p.Copied {
		p.ReadBytes += c.Bytes
		p.WriteBytes += c.Bytes
	}
	p.Excluded = w.excluded
	p.FreeBytes = freeBytes(nearestDir(w.dst))
	p.Fits = p.FreeBytes < 0 || p.FreeBytes >= p.WriteBytes
	largest, size := "", int64(-1)
	for _, f := range w.ck.WeightFiles {
		if st, err := os.Stat(filepath.Join(w.src, f)); err == nil && st.Size() > size {
			largest, size = filepath.Join(w.src, f), st.Size()
		}
	}
	if largest != "" {
		rate, secs, direct, err := measureRead(ctx, largest, rateSample)
		if err != nil {
			return nil, err
		}
		p.ReadRate, p.RateSampleSeconds, p.RateDirect = rate, secs, direct
		if rate > 0 {
			p.EstimatedSeconds = float64(p.ReadBytes) / rate
			if o.DType != "" {
				p.EstimatedSeconds = float64(max(p.ReadBytes, p.WriteBytes)) / rate
			}
		}
	}
	return p, nil
}

// rateSample bounds the read --dry-run times: long enough for the disk to
// reach its pace, short enough not to slow a plan down.
const rateSample = time.Second

// nearestDir is the closest existing directory at or above path.
func nearestDir(path string) string {
	for d := path; ; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d
		}
		if filepath.Dir(d) == d {
			return d
		}
	}
}

// measureRead reads path from its start, 4 MiB at a time, for up to limit
// or to its end, and returns the rate in bytes per second.
func measureRead(ctx context.Context, path string, limit time.Duration) (rate, secs float64, direct bool, err error) {
	const bs = 4 << 20
	f, derr := openDirectRead(path)
	var buf []byte
	if derr == nil {
		b, free, aerr := alignedBuffer(bs)
		if aerr == nil {
			defer free()
			buf, direct = b, true
		} else {
			f.Close()
		}
	}
	if !direct {
		if f, err = safeio.Open(path); err != nil {
			return 0, 0, false, err
		}
		buf = make([]byte, bs)
	}
	defer f.Close()
	start := time.Now()
	var n int64
	for time.Since(start) < limit && ctx.Err() == nil {
		m, err := f.ReadAt(buf, n)
		n += int64(m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if direct && n == 0 {
				// O_DIRECT refused at the first read (EINVAL on some file
				// systems): time it through the page cache instead.
				f.Close()
				return measureReadBuffered(ctx, path, limit)
			}
			return 0, 0, direct, err
		}
	}
	secs = time.Since(start).Seconds()
	if secs > 0 {
		rate = float64(n) / secs
	}
	return rate, secs, direct, ctx.Err()
}

func measureReadBuffered(ctx context.Context, path string, limit time.Duration) (float64, float64, bool, error) {
	f, err := safeio.Open(path)
	if err != nil {
		return 0, 0, false, err
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	start := time.Now()
	var n int64
	for time.Since(start) < limit && ctx.Err() == nil {
		m, err := f.ReadAt(buf, n)
		n += int64(m)
		if err != nil {
			break
		}
	}
	secs := time.Since(start).Seconds()
	if secs <= 0 {
		return 0, 0, false, ctx.Err()
	}
	return float64(n) / secs, secs, false, ctx.Err()
}
