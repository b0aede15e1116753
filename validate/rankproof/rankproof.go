// Package rankproof proves a per-rank output (convert or fuse-shared --ep)
// byte for byte against its source, one rank at a time: the files a rank
// reads (the shared files and its own directory) against the manifest,
// every shared tensor against SRC's tensor of that name, and every slot
// of the rank's stacks against the logical expert the contract's
// placement says it holds, cut to the rank's MoE-TP part. It reads only
// those files of DST, so a node checks what it will serve without reading
// the other ranks'. It is independent of convert: it predicts each slot
// from SRC's expert tensors through the family plan and weightfmt's row
// and column blocks, as the contract describes them.
package rankproof

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/safeio"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/byteproof"
	"github.com/moeprep/moeprep/weightfmt"
)

// Schema names Result's JSON.
const Schema = "moeprep.validate-rank/v1"

// Result is what the proof found. Failure is "" when every byte checked
// is what the contract and SRC say; otherwise it names the rank, and the
// slot where one is at fault.
type Result struct {
	Schema string `json:"schema"`
	Ranks  []int  `json:"ranks"` // the ranks checked
	// Files are DST's files read, each verified against the manifest.
	Files []string `json:"files"`
	// DSTBytesRead and SharedBytes, RankBytes: what the proof read from
	// DST in all, the shared files' size and the checked ranks' files'.
	DSTBytesRead int64 `json:"dst_bytes_read"`
	SharedBytes  int64 `json:"shared_bytes"`
	RankBytes    int64 `json:"rank_bytes"`
	SRCBytesRead int64 `json:"src_bytes_read"`
	Slots        int   `json:"slots"`          // rank slots proven (a slot of one layer's stacks)
	SharedCopies int   `json:"shared_tensors"` // shared tensors proven equal to SRC's
	// Recomposed: each MoE layer's routed experts served from the ranks
	// against SRC's (CheckRecomposed); absent for one rank alone.
	Recomposed []LayerCheck `json:"recomposed,omitempty"`
	// Device is where the recomposition ran ("cpu" or "cuda"; absent
	// without one); LayerSelection the --layers spec; LayersRecomposed
	// the MoE layers it ran on and LayersNotRecomposed the others (left
	// out by --layers, or hash-routed: proven by their bytes alone).
	Device              string `json:"device,omitempty"`
	LayerSelection      string `json:"layer_selection,omitempty"`
	LayersRecomposed    []int  `json:"layers_recomposed,omitempty"`
	LayersNotRecomposed []int  `json:"layers_not_recomposed,omitempty"`
	// Notes: what the run chose that changes what was certified (a
	// --device auto fallback to the CPU).
	Notes   []string `json:"notes,omitempty"`
	Failure string   `json:"failure,omitempty"`
}

// IsPerRank reports whether dst's config.json holds a per-rank contract.
func IsPerRank(dst string) (bool, error) {
	c, err := readContract(dst)
	if err != nil {
		return false, err
	}
	return c != nil && c.ExpertParallel != nil, nil
}

func readContract(dst string) (*layout.Contract, error) {
	p := filepath.Join(dst, checkpoint.ConfigFileName)
	f, err := safeio.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	c, ok, err := layout.ReadContract(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if !ok {
		return nil, nil
	}
	return c, nil
}

// checker is one proof in progress.
type checker struct {
	src  *checkpoint.Checkpoint
	plan *family.Plan
	c    *layout.Contract
	x    *layout.ExpertParallel
	dst  string
	man  *layout.Manifest
	res  *Result
	f    weightfmt.Format // how DST stores the experts
	pred *byteproof.Prediction
}

// failure is a finding: the proof ran and DST is not what it should be.
type failure struct{ msg string }

func (f *failure) Error() string { return f.msg }

func fail(format string, a ...any) error { return &failure{fmt.Sprintf(format, a...)} }

// Check proves rank (every rank when rank < 0) of the per-rank output dst
// against src. An error is input that could not be checked; a finding is
// Result.Failure.
func Check(ctx context.Context, src, dst string, rank int) (*Result, error) {
	c, err := readContract(dst)
	if err != nil {
		return nil, err
	}
	if c == nil || c.ExpertParallel == nil {
		return nil, fmt.Errorf("%s: not a per-rank output (its contract has no expert_parallel); --rank applies to outputs of convert --ep", dst)
	}
	x := c.ExpertParallel
	if rank >= x.Ranks {
		return nil, fmt.Errorf("%s: --rank %d: the output has %d ranks (0..%d)", dst, rank, x.Ranks, x.Ranks-1)
	}
	ck, plan, err := openPlanned(src)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	f, err := c.Format()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dst, err)
	}
	man, err := layout.ReadManifest(dst)
	if err != nil {
		return nil, err
	}
	// What every tensor must hold, as the whole-model byte proof predicts
	// it (--dtype, in-out, --requantize-shared and the fold included); the
	// ranks' slots are cut from its stacks.
	pred, err := byteproof.Predict(ck, plan, c)
	if err != nil {
		return nil, err
	}
	k := &checker{src: ck, plan: plan, c: c, x: x, dst: dst, man: man, res: &Result{Schema: Schema}, f: f, pred: pred}
	ranks := []int{rank}
	if rank < 0 {
		ranks = ranks[:0]
		for r := range x.Ranks {
			ranks = append(ranks, r)
		}
	}
	k.res.Ranks = ranks
	err = k.run(ctx, ranks)
	if fl, ok := err.(*failure); ok {
		k.res.Failure = fl.msg
		return k.res, nil
	}
	return k.res, err
}

func (k *checker) run(ctx context.Context, ranks []int) error {
	if err := k.checkLayers(); err != nil {
		return err
	}
	small, err := k.checkFiles(ctx, "", []string{checkpoint.ConfigFileName, k.x.SharedIndex}, true)
	if err != nil {
		return err
	}
	if err := k.checkConfig(); err != nil {
		return err
	}
	shared, err := k.checkFiles(ctx, "", k.sharedShards(), false)
	if err != nil {
		return err
	}
	k.res.SharedBytes = small + shared
	if err := k.checkShared(ctx); err != nil {
		return err
	}
	for _, r := range ranks {
		ri, _ := k.x.Rank(r)
		who := fmt.Sprintf("rank %d: ", r)
		n, err := k.checkFiles(ctx, who, []string{ri.Index}, true)
		if err != nil {
			return err
		}
		m, err := k.checkFiles(ctx, who, ri.Files, false)
		if err != nil {
			return err
		}
		k.res.RankBytes += n + m
		if err := k.checkRank(ctx, ri); err != nil {
			return err
		}
	}
	return nil
}

// checkLayers: the contract's layers are SRC's MoE layers, its experts SRC's.
func (k *checker) checkLayers() error {
	if k.c.NumExperts != k.plan.NumExperts {
		return fail("contract: num_experts %d, SRC has %d", k.c.NumExperts, k.plan.NumExperts)
	}
	if len(k.c.Layers) != len(k.plan.Layers) {
		return fail("contract: %d MoE layers, SRC has %d", len(k.c.Layers), len(k.plan.Layers))
	}
	for i, li := range k.c.Layers {
		if pl := k.plan.Layers[i]; li.Index != pl.Key() || li.Prefix != pl.Prefix { // Key: a bank apart (ERNIE-4.5-VL)
			return fail("contract: layer %d is %d (%s), SRC's is %d (%s)", i, li.Index, li.Prefix, pl.Key(), pl.Prefix)
		}
	}
	return nil
}

func (k *checker) sharedShards() []string {
	idx, err := safetensors.ReadIndex(filepath.Join(k.dst, k.x.SharedIndex))
	if err != nil {
		return nil // checkFiles then reports the index
	}
	return idx.Shards()
}

// checkFiles verifies each file (relative to DST) against its manifest
// entry and returns their bytes: hashed where hash says (config.json and
// the indexes), by size where not (the shards, whose every tensor byte the
// proof then compares and whose header the safetensors reader parses
// strictly: only the header's padding goes unread, so a rank's check reads
// its files about once).
func (k *checker) checkFiles(ctx context.Context, who string, files []string, hash bool) (int64, error) {
	var total int64
	for _, rel := range files {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		fi, ok := k.man.Files[rel]
		if !ok {
			return total, fail("%s%s: not in the manifest", who, rel)
		}
		p := filepath.Join(k.dst, filepath.FromSlash(rel))
		st, err := os.Lstat(p)
		if err != nil {
			return total, fail("%s%s: missing (%v)", who, rel, err)
		}
		if !st.Mode().IsRegular() {
			return total, fail("%s%s: not a regular file", who, rel)
		}
		if !hash {
			if st.Size() != fi.Size {
				return total, fail("%s%s: %d bytes, its manifest entry says %d", who, rel, st.Size(), fi.Size)
			}
			total += fi.Size
			k.res.Files = append(k.res.Files, rel)
			continue
		}
		h, err := layout.HashFileLike(p, fi)
		if err != nil {
			return total, fail("%s%s: %v", who, rel, err)
		}
		k.res.DSTBytesRead += h.Size
		if h != fi {
			return total, fail("%s%s: does not match its manifest entry (size %d, want %d; or its hash)", who, rel, h.Size, fi.Size)
		}
		total += fi.Size
		k.res.Files = append(k.res.Files, rel)
	}
	return total, nil
}

// checkShared: the shared files hold exactly the tensors outside the
// stacks the prediction names (SRC's other tensors, dequantised where the
// contract says), byte for byte.
func (k *checker) checkShared(ctx context.Context) error {
	sh, err := safetensors.OpenSharded(k.dst)
	if err != nil {
		return fail("shared files: %v", err)
	}
	defer sh.Close()
	seen := map[string]bool{}
	for _, f := range sh.Shards {
		for _, ti := range f.Tensors {
			seen[ti.Name] = true
			d, shape, stack, ok := k.pred.Want(ti.Name)
			if !ok || stack {
				return fail("shared files: %s is not one of SRC's tensors outside the experts", ti.Name)
			}
			if d != ti.DType || !slices.Equal(shape, ti.Shape) {
				return fail("shared files: %s is %s %v, SRC's %s %v", ti.Name, ti.DType, ti.Shape, d, shape)
			}
			sec, err := f.Section(ti.Name)
			if err != nil {
				return err
			}
			want, err := k.pred.Reader(ti.Name)
			if err != nil {
				return err
			}
			if at, err := k.equal(ctx, sec, want, ti.NumBytes()); err != nil {
				return err
			} else if at >= 0 {
				return fail("shared files: %s differs from SRC's at byte %d", ti.Name, at)
			}
			k.res.SharedCopies++
		}
	}
	for _, n := range k.pred.Others() {
		if !seen[n] {
			return fail("shared files: SRC's %s is missing", n)
		}
	}
	return nil
}

// equal compares n bytes of a (DST) and b (their prediction from SRC,
// read in order) in chunks; it returns the first differing offset, or -1.
func (k *checker) equal(ctx context.Context, a io.ReaderAt, b io.Reader, n int64) (int64, error) {
	const chunk = 4 << 20
	x, y := make([]byte, min(n, chunk)), make([]byte, min(n, chunk))
	for off := int64(0); off < n; off += chunk {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		m := min(chunk, n-off)
		if err := readFull(a, x[:m], off); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(b, y[:m]); err != nil {
			return 0, err
		}
		k.res.DSTBytesRead += m
		k.res.SRCBytesRead += m
		if !bytes.Equal(x[:m], y[:m]) {
			for i := range m {
				if x[i] != y[i] {
					return off + i, nil
				}
			}
		}
	}
	return -1, nil
}

// readFull fills p from r at off: a short read is an error.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// checkConfig: DST's config.json is SRC's with the contract added, as the
// whole-model byte proof holds it (a dequantised DST without SRC's
// quantization_config).
func (k *checker) checkConfig() error {
	mm, err := byteproof.CheckConfig(filepath.Join(k.dst, checkpoint.ConfigFileName), filepath.Join(k.src.Dir, checkpoint.ConfigFileName), k.src.ConfigJSON, k.c)
	if err != nil {
		return err
	}
	if mm != nil {
		return fail("config.json: %s: %s", mm.Kind, mm.Detail)
	}
	return nil
}
