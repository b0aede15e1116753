package byteproof

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/cores"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/internal/termsafe"
	"github.com/moeprep/moeprep/layout"
)

// The structural proof: DST checked against its contract byte by byte.
//
// Every DST tensor is predicted from SRC and the contract alone: a stacked
// slice is its source expert's bytes (gate-up: gate rows then up rows, or
// the reverse), a replica is its shared expert's slice (rows of gate and up,
// columns of down, and the matching scale blocks), a folded tensor is its
// source times rsf within one rounding, and every other tensor is the
// source's bytes under the same name. Each DST shard is read once, in file
// order, hashed on the way for the manifest, and compared with the predicted
// bytes read from SRC alongside. Memory is a few fixed chunks.
//
// Before the tensors, the directory is proven (dirproof.go: DST holds the
// manifest's files and nothing else, config.json is SRC's plus the
// contract, every other file a copy of SRC's) and the contract's values are
// derived again from SRC (contractproof.go): a value the bytes cannot show,
// such as shared_slot_weight, is checked there.

// Kinds of structural mismatch.
const (
	MismatchBytes    = "bytes differ"
	MismatchFold     = "folded value off"
	MismatchShape    = "dtype or shape"
	MismatchMissing  = "missing"
	MismatchExtra    = "unexpected"
	MismatchManifest = "manifest"
	MismatchNaN      = "non-finite"
	// The directory proof (dirproof.go, contractproof.go).
	MismatchConfig   = "config"       // config.json is not SRC's plus the contract
	MismatchContract = "contract"     // a contract value is not what SRC implies
	MismatchFile     = "file"         // a file DST should not hold, or a copy it lacks
	MismatchCopy     = "copy differs" // a copied file's bytes are not SRC's
)

// ByteMismatch is the first structural difference found.
type ByteMismatch struct {
	Kind   string `json:"kind"`
	File   string `json:"file,omitempty"`
	Tensor string `json:"tensor,omitempty"`
	Layer  int    `json:"layer"`            // -1: not an expert tensor
	Expert int    `json:"expert"`           // bank id, -1: not an expert slice
	Offset int64  `json:"offset,omitempty"` // byte offset within the tensor
	Detail string `json:"detail"`
}

func (m *ByteMismatch) Error() string {
	where := m.Tensor
	if m.Layer >= 0 && where != "" {
		where += fmt.Sprintf(" (layer %s", family.KeyLabel(m.Layer))
		if m.Expert >= 0 {
			where += fmt.Sprintf(", expert %d", m.Expert)
		}
		where += ")"
	}
	if m.File != "" && where != "" {
		where = m.File + ": " + where
	} else if m.File != "" {
		where = m.File
	}
	// Names and values come from the files under test: escaped, they cannot
	// break the line or steer the terminal.
	if where != "" {
		where += ": "
	}
	if m.Kind == MismatchBytes || m.Kind == MismatchFold || m.Kind == MismatchNaN || m.Kind == MismatchCopy || m.Kind == MismatchDequant {
		return termsafe.Escape(fmt.Sprintf("%s%s at byte %d: %s", where, m.Kind, m.Offset, m.Detail))
	}
	return termsafe.Escape(fmt.Sprintf("%s%s: %s", where, m.Kind, m.Detail))
}

// BytesResult is the structural check of a run.
type BytesResult struct {
	Pass     bool          `json:"pass"`
	Tensors  int           `json:"tensors"`
	Files    int           `json:"files"`
	Copies   int           `json:"copied_files"` // files copied from SRC, each compared with SRC's
	DstBytes int64         `json:"dst_bytes"`
	SrcBytes int64         `json:"src_bytes"`
	Seconds  float64       `json:"seconds"`
	Mismatch *ByteMismatch `json:"mismatch,omitempty"`
	// FoldMaxRelChange is the largest |dst - src*rsf| / |src*rsf| over the
	// folded values, against the contract's fold_max_rel_change.
	FoldMaxRelChange float64 `json:"fold_max_rel_change,omitempty"`
	// Dequantized is how many DST tensors were predicted by dequantising
	// SRC's weights (a dequantised DST) and matched bit for bit.
	Dequantized int `json:"dequantized_tensors,omitempty"`
}

// CheckBytes proves DST against SRC and the contract: the directory (every
// file listed in the manifest and nothing else, dirproof.go), the contract's
// values (contractproof.go), config.json and the copied files, then every
// tensor byte. A mismatch is reported in the result (Pass false), an
// unreadable input is an error.
func CheckBytes(ctx context.Context, src, dst *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract, progress func(string)) (*BytesResult, error) {
	pr, res, err := prepare(src, dst, plan, c)
	if err != nil || res != nil {
		return res, err
	}
	// Files are checked concurrently (each shard reads, hashes and compares
	// in its own pipeline of a few chunks); the first mismatch in file-name
	// order is the one reported.
	results := make([]fileResult, len(pr.names))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(min(4, max(1, cores.N())))
	for i, rel := range pr.names {
		g.Go(func() error {
			var err error
			if pr.isShard(rel) {
				if progress != nil {
					progress(fmt.Sprintf("validate --bytes: %s (%s)", rel, human.Bytes(pr.man.Files[rel].Size)))
				}
				results[i], err = pr.checkShard(gctx, rel)
			} else {
				results[i], err = pr.checkFile(gctx, rel)
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return pr.result(results), nil
}

// proofRun is one byte proof past the directory checks: what CheckBytes
// and Stream share.
type proofRun struct {
	start   time.Time
	src     *checkpoint.Checkpoint
	dst     *checkpoint.Checkpoint
	c       *layout.Contract
	man     *layout.Manifest
	names   []string        // the manifest's files, sorted
	copies  map[string]bool // files copied from SRC
	weights map[string]bool // DST's weight files
	cfgPath string
	pred    *prediction
}

// fileResult is what checking one file of the manifest found.
type fileResult struct {
	got layout.FileInfo
	mm  *ByteMismatch
	st  shardStats
}

// prepare runs the cheap checks, the manifest's names before any of them
// is opened (an entry may point anywhere), and predicts every tensor. A
// mismatch found there is the proof's result (res, with pr nil).
func prepare(src, dst *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract) (pr *proofRun, res *BytesResult, err error) {
	start := time.Now()
	fail := func(m *ByteMismatch) (*proofRun, *BytesResult, error) {
		return nil, &BytesResult{Mismatch: m, Seconds: time.Since(start).Seconds()}, nil
	}
	man, mm, err := readManifest(dst.Dir)
	if err != nil {
		return nil, nil, err
	}
	if mm != nil {
		return fail(mm)
	}
	if mm, err := checkTree(dst.Dir, man); err != nil {
		return nil, nil, err
	} else if mm != nil {
		return fail(mm)
	}
	if mm := checkManifestNames(dst, man); mm != nil {
		return fail(mm)
	}
	cfgPath := filepath.Join(dst.Dir, checkpoint.ConfigFileName)
	if mm := checkContract(cfgPath, src, plan, c); mm != nil {
		return fail(mm)
	}
	// moeprep's own outputs; every other file must be a copy of SRC's.
	ours := map[string]bool{checkpoint.ConfigFileName: true, layout.ManifestFileName: true}
	weights := map[string]bool{}
	for _, f := range dst.WeightFiles {
		ours[filepath.ToSlash(f)] = true
		weights[filepath.ToSlash(f)] = true
	}
	copies, mm, err := checkCopiesListed(src, dst.Dir, man, ours, c)
	if err != nil {
		return nil, nil, err
	}
	if mm != nil {
		return fail(mm)
	}
	pred, err := predict(src, plan, c)
	if err != nil {
		return nil, nil, err
	}
	return &proofRun{start: start, src: src, dst: dst, c: c, man: man, names: sortedKeys(man.Files), copies: copies,
		weights: weights, cfgPath: cfgPath, pred: pred}, nil, nil
}

// isShard reports whether the manifest's file rel is a safetensors shard,
// whose tensors are compared.
func (pr *proofRun) isShard(rel string) bool {
	return pr.weights[rel] && strings.HasSuffix(rel, ".safetensors")
}

func (pr *proofRun) path(rel string) string {
	return filepath.Join(pr.dst.Dir, filepath.FromSlash(rel))
}

// checkShard reads shard rel in file order and compares it.
func (pr *proofRun) checkShard(ctx context.Context, rel string) (fileResult, error) {
	var r fileResult
	var err error
	r.got, r.mm, r.st, err = checkShard(ctx, pr.path(rel), pr.man.Files[rel], pr.pred)
	return r, err
}

// checkFile checks a file of the manifest that is not a shard: config.json,
// a copy of SRC's, or the index (its contents are what opened DST).
func (pr *proofRun) checkFile(ctx context.Context, rel string) (fileResult, error) {
	var r fileResult
	var err error
	path, like := pr.path(rel), pr.man.Files[rel]
	switch {
	case rel == checkpoint.ConfigFileName:
		r.got, r.mm, err = checkConfigFile(path, like, filepath.Join(pr.src.Dir, checkpoint.ConfigFileName), pr.src.ConfigJSON, pr.c)
	case pr.copies[rel]:
		r.got, r.mm, err = checkCopy(ctx, path, filepath.Join(pr.src.Dir, filepath.FromSlash(rel)), like)
	default:
		r.got, err = layout.HashFileLike(path, like)
	}
	return r, err
}

// result sums the files' results, in the manifest's name order, into the
// proof's: the first mismatch in that order, then a predicted tensor no
// shard holds, then the folded values against the contract's statement.
func (pr *proofRun) result(results []fileResult) *BytesResult {
	res := &BytesResult{}
	dst, c, pred := pr.dst, pr.c, pr.pred
	seen := map[string]bool{}
	for i, rel := range pr.names {
		fr := results[i]
		res.Files++
		if pr.copies[rel] {
			res.Copies++
		}
		res.DstBytes += fr.got.Size
		res.SrcBytes += fr.st.srcBytes
		res.Tensors += len(fr.st.tensors)
		res.FoldMaxRelChange = max(res.FoldMaxRelChange, fr.st.foldMax)
		res.Dequantized += fr.st.dequantized
		for _, n := range fr.st.tensors {
			if seen[n] && res.Mismatch == nil {
				res.Mismatch = &ByteMismatch{Kind: MismatchExtra, File: filepath.Join(dst.Dir, rel), Tensor: n, Layer: pred.meta[n].layer, Expert: -1, Detail: "in two shards"}
			}
			seen[n] = true
		}
		if res.Mismatch != nil {
			continue
		}
		if fr.mm != nil {
			res.Mismatch = fr.mm
			continue
		}
		if want := pr.man.Files[rel]; fr.got != want {
			res.Mismatch = &ByteMismatch{Kind: MismatchManifest, File: filepath.Join(dst.Dir, filepath.FromSlash(rel)), Layer: -1, Expert: -1,
				Detail: fmt.Sprintf("%s, the manifest says %s", fr.got, want)}
		}
	}
	if res.Mismatch == nil {
		for _, n := range sortedKeys(pred.meta) {
			if !seen[n] {
				w := pred.meta[n]
				res.Mismatch = &ByteMismatch{Kind: MismatchMissing, Tensor: n, Layer: w.layer, Expert: -1,
					Detail: "SRC and the contract call for it, DST has no such tensor"}
				break
			}
		}
	}
	// fold_max_rel_change is measured here as convert measures it (the same
	// float64 operations on the same values, and JSON gives the float64
	// back exactly), so a genuine output states what the bytes show, no
	// more and no less; the slack is a margin, not something outputs need.
	if res.Mismatch == nil && c.RoutedScalingFactorFolded {
		switch stated, got := c.FoldMaxRelChange, res.FoldMaxRelChange; {
		case got > stated*(1+1e-6)+1e-12:
			res.Mismatch = &ByteMismatch{Kind: MismatchFold, Layer: -1, Expert: -1,
				Detail: fmt.Sprintf("folded values move by up to %.3g, the contract states fold_max_rel_change %.3g", got, stated)}
		case got < stated*(1-1e-6)-1e-12:
			res.Mismatch = &ByteMismatch{Kind: MismatchContract, File: pr.cfgPath, Layer: -1, Expert: -1,
				Detail: fmt.Sprintf("%s.fold_max_rel_change is %v, the folded values move by up to %v", layout.ContractKey, stated, got)}
		}
	}
	res.Pass = res.Mismatch == nil
	res.Seconds = time.Since(pr.start).Seconds()
	return res
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// checkManifestNames checks that the manifest lists every weight file DST
// holds (a shard left out of the manifest would go unchecked).
func checkManifestNames(dst *checkpoint.Checkpoint, m *layout.Manifest) *ByteMismatch {
	for _, f := range dst.WeightFiles {
		if _, ok := m.Files[filepath.ToSlash(f)]; !ok {
			return &ByteMismatch{Kind: MismatchManifest, File: filepath.Join(dst.Dir, f), Layer: -1, Expert: -1,
				Detail: "weight file not listed in " + layout.ManifestFileName}
		}
	}
	return nil
}
