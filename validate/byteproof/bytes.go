package byteproof

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/internal/safeio"
	"github.com/moeprep/moeprep/internal/termsafe"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/validate/tensorbytes"
	"github.com/moeprep/moeprep/weightfmt"
	"golang.org/x/sync/errgroup"
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
		where += fmt.Sprintf(" (layer %s", family.LayerLabel(m.Layer))
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

// segment is a run of DST bytes and how to predict them: src bytes as they
// are, or src values times fold.
type segment struct {
	off    int64 // within the DST tensor
	n      int64
	src    *checkpoint.Tensor
	ranges [][2]int64 // byte ranges of src, in order, totalling n (dq: src's weight bytes)
	fold   float64    // 0: exact bytes
	// dq: the n bytes are src's weight (ranges) dequantised and rounded
	// once (dequant.go); nil: src's bytes themselves.
	dq     *dequantSeg
	layer  int
	expert int
	io     *ioSeg // an in-out slice (inout.go): its bytes, not ranges
}

// prediction is every DST tensor's segments, by name.
type prediction struct {
	tensors map[string][]segment
	meta    map[string]tensorWant
}

type tensorWant struct {
	dtype  safetensors.DType
	shape  []int64
	layer  int
	expert int // -1
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
	g.SetLimit(min(4, max(1, runtime.GOMAXPROCS(0))))
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

// predict lays out what every DST tensor must hold.
func predict(src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract) (*prediction, error) {
	p := &prediction{tensors: map[string][]segment{}, meta: map[string]tensorWant{}}
	if c.NumExperts != plan.NumExperts {
		return nil, fmt.Errorf("%s: the contract has %d routed experts, SRC %d", src.Dir, c.NumExperts, plan.NumExperts)
	}
	consumed := map[string]bool{}
	byIndex := map[int]*family.Layer{}
	for i := range plan.Layers {
		byIndex[plan.Layers[i].Index] = &plan.Layers[i]
	}
	if len(c.Layers) != len(plan.Layers) {
		return nil, fmt.Errorf("%s: the contract lists %d MoE layers, SRC has %d", src.Dir, len(c.Layers), len(plan.Layers))
	}
	for _, li := range c.Layers {
		l, ok := byIndex[li.Index]
		if !ok {
			return nil, fmt.Errorf("%s: contract layer %d is not a MoE layer of SRC", src.Dir, li.Index)
		}
		if err := p.layer(src, plan, c, li, l, consumed); err != nil {
			return nil, err
		}
	}
	if err := p.predictOthers(src, c, consumed); err != nil {
		return nil, err
	}
	for _, t := range src.Tensors {
		if consumed[t.Name] {
			continue
		}
		if _, dup := p.meta[t.Name]; dup {
			return nil, fmt.Errorf("%s: tensor %s would be both a stack and a copied tensor", src.Dir, t.Name)
		}
		p.meta[t.Name] = tensorWant{dtype: t.DType, shape: t.StoredShape(), layer: -1, expert: -1}
		p.tensors[t.Name] = []segment{{n: t.NumBytes(), src: t, ranges: [][2]int64{{0, t.NumBytes()}}, layer: -1, expert: -1}}
	}
	return p, nil
}

// mat is a 2-D view [rows, cols] of a source tensor.
type mat struct {
	t          *checkpoint.Tensor
	rows, cols int64
}

// all is the byte ranges of the whole of m.
func (m mat) all() [][2]int64 {
	return weightfmt.Matrix{Format: weightfmt.Plain(m.t.DType), Rows: m.rows, Cols: m.cols}.Whole().Weight.Ranges()
}

func (p *prediction) layer(src *checkpoint.Checkpoint, plan *family.Plan, c *layout.Contract, li layout.LayerInfo, l *family.Layer, consumed map[string]bool) error {
	I, H := int64(plan.IntermediateOf(*l)), int64(plan.HiddenSize)
	E := c.NumExperts
	bank := c.BankSize()
	of, err := c.Format() // how DST stores the experts
	if err != nil {
		return fmt.Errorf("%s: %w", src.Dir, err)
	}
	// How SRC stores them: as DST does, or as the contract records the
	// dequantised experts' source format; a shared expert dequantising
	// leaves plain (Kimi's BF16 beside INT4) is read as plain.
	wf, sharedF, err := srcFormats(plan, c, of)
	if err != nil {
		return fmt.Errorf("%s: %w", src.Dir, err)
	}
	sf, _ := of.Scale()
	S := int64(max(c.SharedSlices, 1))
	if c.NumFusedSharedExperts > 0 && l.Shared == nil {
		return fmt.Errorf("%s: layer %d: the contract fuses a shared expert SRC does not have", src.Dir, li.Index)
	}
	gateRows := weightfmt.Matrix{Format: sharedF, Rows: S * I, Cols: H}
	downCols := weightfmt.Matrix{Format: sharedF, Rows: H, Cols: S * I}
	for s := int64(1); c.NumFusedSharedExperts > 0 && s < S; s++ {
		if !gateRows.RowSplitExact(s*I) || !downCols.ColSplitExact(s*I) {
			return fmt.Errorf("%s: layer %d: I %d is not a multiple of the %s block, so the shared expert cannot be split", src.Dir, li.Index, I, sharedF)
		}
	}
	// rsf, when folded, multiplies the routed experts' down weights or
	// their scales, as the format folds it.
	fold := wf.Fold()
	if c.RoutedScalingFactorFolded && fold.Into == weightfmt.FoldNowhere {
		return fmt.Errorf("%s: the contract folds routed_scaling_factor into %s experts, which cannot take it: %s", src.Dir, wf, fold.Refusal("it"))
	}
	// A requantised shared expert (shared_requantized) is predicted by
	// quantising SRC's plain shared expert again into the contract's
	// format: virtual tensors computed from SRC's bytes.
	virtual := map[string]*checkpoint.Tensor{}
	var requant family.MLP
	if c.SharedRequantized != nil && l.Shared != nil {
		var err error
		if requant, err = checkpoint.RequantisedMLP(src, *l.Shared, wf, func(t *checkpoint.Tensor) { virtual[t.Name] = t }); err != nil {
			return fmt.Errorf("layer %d: %w", li.Index, err)
		}
		for _, n := range []string{l.Shared.Gate, l.Shared.Up, l.Shared.Down} {
			consumed[checkpoint.BaseName(n)] = true
		}
	}
	get := func(name string, rows, cols int64) (mat, error) {
		t, ok := virtual[name]
		if !ok {
			t, ok = src.Tensor(name)
		}
		if !ok {
			return mat{}, fmt.Errorf("%s: layer %d: tensor %s is missing", src.Dir, li.Index, name)
		}
		if len(t.Shape) != 2 || t.Shape[0] != rows || t.Shape[1] != cols {
			return mat{}, fmt.Errorf("%s: layer %d: tensor %s has shape %v, want [%d,%d]", t.File, li.Index, name, t.Shape, rows, cols)
		}
		consumed[checkpoint.BaseName(name)] = true // a view consumes the stacked tensor it is cut from
		return mat{t, rows, cols}, nil
	}
	// parts of bank expert b: gate, up, down and their scales, as
	// (tensor, byte ranges) with the fold factor of each.
	type piece struct {
		m      mat
		ranges [][2]int64
		fold   float64
		dq     *dequantSeg // dequantised from m's bytes (ranges), nil: those bytes
	}
	type parts struct {
		gate, up, down, gs, us, ds, gb, ub, db piece
		gg, ug, dg, gi, ui, di                 piece // NVFP4: global and input scales (one F32 each)
	}
	glob, globbed := weightfmt.GlobalOf(wf)
	scalar := func(name string) (piece, error) {
		t, ok := src.Tensor(name)
		if !ok {
			return piece{}, fmt.Errorf("%s: layer %d: tensor %s is missing", src.Dir, li.Index, name)
		}
		if t.DType != glob.DType || t.NumElements() != 1 {
			return piece{}, fmt.Errorf("%s: layer %d: tensor %s is %s %v, want one %s", t.File, li.Index, name, t.DType, t.Shape, glob.DType)
		}
		consumed[checkpoint.BaseName(name)] = true
		m := mat{t, 1, 1}
		return piece{m, m.all(), 0, nil}, nil
	}
	rsf := 0.0
	if c.RoutedScalingFactorFolded {
		rsf = c.RoutedScalingFactor
	}
	expert := func(b int) (parts, error) {
		var pr parts
		m, s, n := family.MLP{}, int64(0), int64(1)
		routed := b < E
		wf := wf
		if routed {
			m = l.Experts[b]
		} else {
			m = *l.Shared
			if c.SharedRequantized != nil {
				m = requant
			}
			s, n = int64((b-E)%int(S)), S
			wf = sharedF
		}
		_, scaled := wf.Scale()
		// The stored [rows, cols]: fewer columns where elements pack
		// (INT4: eight to an I32 along a row).
		gsh := weightfmt.Matrix{Format: wf, Rows: n * I, Cols: H}.Shape()
		dsh := weightfmt.Matrix{Format: wf, Rows: H, Cols: n * I}.Shape()
		var g mat
		var err error
		if m.Gate != "" { // "": ungated (Nemotron-H), whose contract names no gate stack
			if g, err = get(m.Gate, gsh[0], gsh[1]); err != nil {
				return pr, err
			}
		} else if scaled {
			return pr, fmt.Errorf("%s: layer %d: ungated experts stored in %s are not supported", src.Dir, li.Index, wf)
		}
		u, err := get(m.Up, gsh[0], gsh[1])
		if err != nil {
			return pr, err
		}
		d, err := get(m.Down, dsh[0], dsh[1])
		if err != nil {
			return pr, err
		}
		// compressed-tensors' weight_shape (INT4): checked by the plan
		// (it holds the expert's [out, in]) and not written: the contract
		// states every expert's shape.
		for _, sh := range []string{m.GateShape, m.UpShape, m.DownShape} {
			if sh == "" {
				continue
			}
			if _, ok := src.Tensor(sh); !ok {
				return pr, fmt.Errorf("%s: layer %d: tensor %s is missing", src.Dir, li.Index, sh)
			}
			consumed[checkpoint.BaseName(sh)] = true
		}
		// Slice s of a shared expert of n*I (all of a routed expert, n = 1).
		rows := weightfmt.Matrix{Format: wf, Rows: n * I, Cols: H}.RowBlock(s*I, I)
		cols := weightfmt.Matrix{Format: wf, Rows: H, Cols: n * I}.ColBlock(s*I, I)
		pr.gate = piece{g, rows.Weight.Ranges(), 0, nil}
		pr.up = piece{u, rows.Weight.Ranges(), 0, nil}
		pr.down = piece{d, cols.Weight.Ranges(), 0, nil}
		if routed && fold.Into == weightfmt.FoldWeights {
			pr.down.fold = rsf
		}
		if c.ExpertBias { // views [I,1], [I,1] and [1,H] of the stacked biases
			if m.GateBias == "" || !routed {
				return pr, fmt.Errorf("%s: layer %d: the contract has expert biases, SRC's expert %d has none", src.Dir, li.Index, b)
			}
			for _, x := range []struct {
				name       string
				rows, cols int64
				dst        *piece
			}{{m.GateBias, I, 1, &pr.gb}, {m.UpBias, I, 1, &pr.ub}, {m.DownBias, 1, H, &pr.db}} {
				v, err := get(x.name, x.rows, x.cols)
				if err != nil {
					return pr, err
				}
				*x.dst = piece{v, v.all(), 0, nil}
			}
		}
		if globbed {
			ins := []string{m.GateInput, m.UpInput, m.DownInput}
			if !c.InputScales && c.Dequantized == nil {
				ins = []string{"", "", ""}
			} else if c.InputScales && m.GateInput == "" {
				return pr, fmt.Errorf("%s: layer %d: the contract has input_scales, SRC's expert %d has none", src.Dir, li.Index, b)
			}
			for i, x := range []struct {
				name string
				dst  *piece
			}{{m.GateGlobal, &pr.gg}, {m.UpGlobal, &pr.ug}, {m.DownGlobal, &pr.dg}, {ins[0], &pr.gi}, {ins[1], &pr.ui}, {ins[2], &pr.di}} {
				if i >= 3 && x.name == "" {
					continue
				}
				if *x.dst, err = scalar(x.name); err != nil {
					return pr, err
				}
			}
		}
		if !scaled {
			return pr, nil
		}
		gr, gc := weightfmt.Matrix{Format: wf, Rows: n * I, Cols: H}.ScaleShape()
		dr, dc := weightfmt.Matrix{Format: wf, Rows: H, Cols: n * I}.ScaleShape()
		gs, err := get(m.GateScale, gr, gc)
		if err != nil {
			return pr, err
		}
		us, err := get(m.UpScale, gr, gc)
		if err != nil {
			return pr, err
		}
		ds, err := get(m.DownScale, dr, dc)
		if err != nil {
			return pr, err
		}
		pr.gs = piece{gs, rows.Scale.Ranges(), 0, nil}
		pr.us = piece{us, rows.Scale.Ranges(), 0, nil}
		pr.ds = piece{ds, cols.Scale.Ranges(), 0, nil}
		if routed && fold.Into == weightfmt.FoldScales {
			pr.ds.fold = rsf
		}
		if c.Dequantized != nil {
			// DST holds each weight dequantised: its values from the
			// weight's bytes, its scales' and its global scale's.
			to := safetensors.DType(c.Dequantized.DType)
			for _, x := range []struct {
				w, s, g    *piece
				rows, cols int64
			}{{&pr.gate, &pr.gs, &pr.gg, I, H}, {&pr.up, &pr.us, &pr.ug, I, H}, {&pr.down, &pr.ds, &pr.dg, H, I}} {
				x.w.dq = &dequantSeg{m: weightfmt.Matrix{Format: wf, Rows: x.rows, Cols: x.cols}, to: to,
					scale: x.s.m.t, scaleRanges: x.s.ranges, global: x.g.m.t, globalRanges: x.g.ranges}
			}
		}
		return pr, nil
	}
	banks := make([]parts, bank)
	for b := range bank {
		var err error
		if banks[b], err = expert(b); err != nil {
			return err
		}
	}
	if l.Shared != nil && c.NumFusedSharedExperts == 0 {
		// an unfused shared expert is copied as it is
		for _, n := range []string{l.Shared.Gate, l.Shared.Up, l.Shared.Down, l.Shared.GateScale, l.Shared.UpScale, l.Shared.DownScale,
			l.Shared.GateGlobal, l.Shared.UpGlobal, l.Shared.DownGlobal, l.Shared.GateInput, l.Shared.UpInput, l.Shared.DownInput} {
			if n == "" {
				continue
			}
			delete(consumed, checkpoint.BaseName(n))
		}
	}
	names := c.Names(li)
	shapes := c.Shapes(int64(bank), I, H)
	wd, err := safetensors.ParseDType(c.WeightDType)
	if err != nil {
		return fmt.Errorf("%s: contract weight_dtype: %w", src.Dir, err)
	}
	inOut := c.Oriented() == layout.InOut
	gr, gc := weightfmt.Matrix{Format: wf, Rows: I, Cols: H}.ScaleShape()
	dr, dc := weightfmt.Matrix{Format: wf, Rows: H, Cols: I}.ScaleShape()
	// The [out, in] of each piece of a weight or scale stack, which an
	// in-out stack holds transposed.
	gm, dm, gsm, dsm := [2]int64{I, H}, [2]int64{H, I}, [2]int64{gr, gc}, [2]int64{dr, dc}
	// ioSlice is the in-out slice of pieces, each of an [rows, cols]
	// matrix: its transpose, or, where SRC stores the expert transposed
	// (a view of a Llama 4 or gpt-oss stack), its stored rows.
	ioSlice := func(pcs []piece, rows, cols int64) (*ioSeg, error) {
		srcs := make([]ioSrc, len(pcs))
		for i, pc := range pcs {
			es := int64(pc.m.t.DType.Size())
			srcs[i] = ioSrc{t: pc.m.t, ranges: pc.ranges, rows: rows, cols: cols, es: es}
			if st, ok := pc.m.t.Untransposed(); ok {
				if pc.m.rows != rows || pc.m.cols != cols {
					return nil, fmt.Errorf("tensor %s: a slice of an expert stored transposed", pc.m.t.Name)
				}
				srcs[i] = ioSrc{t: st, ranges: [][2]int64{{0, st.NumBytes()}}, rows: cols, cols: rows, es: es, stored: true}
			}
		}
		return newIOSeg(srcs...)
	}
	var addErr error
	add := func(name string, d safetensors.DType, shape []int64, mat [2]int64, pick func(parts) []piece) {
		if name == "" {
			return
		}
		p.meta[name] = tensorWant{dtype: d, shape: shape, layer: li.Index, expert: -1}
		var segs []segment
		var off int64
		for b, pr := range banks {
			if inOut && mat[0] > 0 {
				g, err := ioSlice(pick(pr), mat[0], mat[1])
				if err != nil && addErr == nil {
					addErr = fmt.Errorf("%s: layer %d: %w", src.Dir, li.Index, err)
				}
				if err == nil {
					segs = append(segs, segment{off: off, n: g.size(), src: g.srcs[0].t, fold: pick(pr)[0].fold, layer: li.Index, expert: b, io: g})
					off += g.size()
				}
				continue
			}
			for _, pc := range pick(pr) {
				var n int64
				for _, r := range pc.ranges {
					n += r[1] - r[0]
				}
				if pc.dq != nil {
					n = pc.dq.size()
				}
				segs = append(segs, segment{off: off, n: n, src: pc.m.t, ranges: pc.ranges, fold: pc.fold, dq: pc.dq, layer: li.Index, expert: b})
				off += n
			}
		}
		p.tensors[name] = segs
	}
	one := func(f func(parts) piece) func(parts) []piece { return func(pr parts) []piece { return []piece{f(pr)} } }
	if c.Layout.Fused() {
		first, second := func(pr parts) piece { return pr.gate }, func(pr parts) piece { return pr.up }
		fs, ss := func(pr parts) piece { return pr.gs }, func(pr parts) piece { return pr.us }
		if c.Layout == layout.UpGate {
			first, second, fs, ss = second, first, ss, fs
		}
		add(names.GateUp, wd, shapes.GateUp, gm, func(pr parts) []piece { return []piece{first(pr), second(pr)} })
		add(names.GateUpScale, sf.DType, shapes.GateUpScale, gsm, func(pr parts) []piece { return []piece{fs(pr), ss(pr)} })
	} else {
		add(names.Gate, wd, shapes.Gate, gm, one(func(pr parts) piece { return pr.gate }))
		add(names.Up, wd, shapes.Up, gm, one(func(pr parts) piece { return pr.up }))
		add(names.GateScale, sf.DType, shapes.GateScale, gsm, one(func(pr parts) piece { return pr.gs }))
		add(names.UpScale, sf.DType, shapes.UpScale, gsm, one(func(pr parts) piece { return pr.us }))
	}
	add(names.Down, wd, shapes.Down, dm, one(func(pr parts) piece { return pr.down }))
	add(names.DownScale, sf.DType, shapes.DownScale, dsm, one(func(pr parts) piece { return pr.ds }))
	if globbed {
		type set struct {
			gate, up, gateUp, down string
			pick                   func(parts) (piece, piece, piece)
		}
		sets := []set{{names.GateGlobal, names.UpGlobal, names.GateUpGlobal, names.DownGlobal, func(pr parts) (piece, piece, piece) { return pr.gg, pr.ug, pr.dg }}}
		if c.InputScales {
			sets = append(sets, set{names.GateInput, names.UpInput, names.GateUpInput, names.DownInput, func(pr parts) (piece, piece, piece) { return pr.gi, pr.ui, pr.di }})
		}
		for _, st := range sets {
			pk := st.pick
			if c.Layout.Fused() {
				add(st.gateUp, glob.DType, shapes.GateUpGlobal, [2]int64{}, func(pr parts) []piece {
					g, u, _ := pk(pr)
					if c.Layout == layout.UpGate {
						g, u = u, g
					}
					return []piece{g, u}
				})
			} else {
				add(st.gate, glob.DType, shapes.GateGlobal, [2]int64{}, one(func(pr parts) piece { g, _, _ := pk(pr); return g }))
				add(st.up, glob.DType, shapes.UpGlobal, [2]int64{}, one(func(pr parts) piece { _, u, _ := pk(pr); return u }))
			}
			add(st.down, glob.DType, shapes.DownGlobal, [2]int64{}, one(func(pr parts) piece { _, _, d := pk(pr); return d }))
		}
	}
	if bn, ok := c.Biases(li); ok {
		n, bd := int64(bank), banks[0].gb.m.t.DType
		first, second := func(pr parts) piece { return pr.gb }, func(pr parts) piece { return pr.ub }
		if c.Layout == layout.UpGate {
			first, second = second, first
		}
		add(bn.GateUp, bd, []int64{n, 2 * I}, [2]int64{}, func(pr parts) []piece { return []piece{first(pr), second(pr)} })
		add(bn.Gate, bd, []int64{n, I}, [2]int64{}, one(first))
		add(bn.Up, bd, []int64{n, I}, [2]int64{}, one(second))
		add(bn.Down, bd, []int64{n, H}, [2]int64{}, one(func(pr parts) piece { return pr.db }))
	}
	return addErr
}

// shardStats is what one shard's check saw.
type shardStats struct {
	tensors     []string
	srcBytes    int64
	foldMax     float64
	dequantized int // tensors predicted by dequantising
}

// checkShard reads one DST shard in file order, hashing it, and compares
// each tensor with its prediction, read from SRC a few chunks ahead. It
// returns the file's size and hash and the first mismatch.
func checkShard(ctx context.Context, path string, like layout.FileInfo, pred *prediction) (layout.FileInfo, *ByteMismatch, shardStats, error) {
	var st shardStats
	fail := func(err error) (layout.FileInfo, *ByteMismatch, shardStats, error) {
		return layout.FileInfo{}, nil, st, err
	}
	f, err := safetensors.Open(path)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	fh, err := safeio.Open(path)
	if err != nil {
		return fail(err)
	}
	defer fh.Close()
	// The predicted bytes of every tensor the shard holds, in file order;
	// the stream ends early at a tensor nothing predicts (reported below).
	var segs []segment
	for _, ti := range f.Tensors {
		w, ok := pred.meta[ti.Name]
		if !ok || ti.DType != w.dtype || !slices.Equal(ti.Shape, w.shape) {
			break
		}
		segs = append(segs, pred.tensors[ti.Name]...)
	}
	want := newAheadReader(&segReader{segs: segs})
	defer want.stop()
	h := layout.NewHasher(like) // hashed the way the manifest did
	dr := newAheadReader(io.TeeReader(fh, h))
	defer dr.stop()
	var size int64
	skip := func(n int64) error {
		m, err := io.CopyN(io.Discard, dr, n)
		size += m
		return err
	}
	if err := skip(f.DataStart); err != nil {
		return fail(fmt.Errorf("%s: %w", path, err))
	}
	got := make([]byte, compareChunk)
	exp := make([]byte, compareChunk)
	for i := range f.Tensors {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		ti := &f.Tensors[i]
		if gap := f.DataStart + ti.Begin - size; gap != 0 {
			if err := skip(gap); err != nil {
				return fail(fmt.Errorf("%s: %w", path, err))
			}
		}
		w, ok := pred.meta[ti.Name]
		if !ok {
			return layout.FileInfo{}, &ByteMismatch{Kind: MismatchExtra, File: path, Tensor: ti.Name, Layer: -1, Expert: -1,
				Detail: "neither a stack the contract names nor a tensor of SRC"}, st, nil
		}
		if ti.DType != w.dtype || !slices.Equal(ti.Shape, w.shape) {
			return layout.FileInfo{}, &ByteMismatch{Kind: MismatchShape, File: path, Tensor: ti.Name, Layer: w.layer, Expert: -1,
				Detail: fmt.Sprintf("%s %v, want %s %v", ti.DType, ti.Shape, w.dtype, w.shape)}, st, nil
		}
		st.tensors = append(st.tensors, ti.Name)
		if segs := pred.tensors[ti.Name]; len(segs) > 0 && segs[0].dq != nil {
			st.dequantized++
		}
		es := int64(ti.DType.Size())
		step := int64(compareChunk) / es * es
		for _, sg := range pred.tensors[ti.Name] {
			if sg.dq != nil {
				st.srcBytes += sg.dq.srcBytes(sg.ranges)
			}
			for done := int64(0); done < sg.n; done += step {
				n := min(step, sg.n-done)
				if _, err := io.ReadFull(dr, got[:n]); err != nil {
					return fail(fmt.Errorf("%s: tensor %s: %w", path, ti.Name, err))
				}
				size += n
				if _, err := io.ReadFull(want, exp[:n]); err != nil {
					return fail(fmt.Errorf("tensor %s: reading its prediction from SRC: %w", ti.Name, err))
				}
				if sg.dq == nil {
					st.srcBytes += n
				}
				if mm := compareSeg(path, ti, sg, got[:n], exp[:n], sg.off+done, &st.foldMax); mm != nil {
					return layout.FileInfo{}, mm, st, nil
				}
			}
		}
	}
	rest, err := io.Copy(io.Discard, dr)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", path, err))
	}
	size += rest
	sum := h.Sum()
	if sum.Size != size {
		return fail(fmt.Errorf("%s: hashed %d bytes, read %d", path, sum.Size, size))
	}
	return sum, nil, st, nil
}

// compareChunk is the unit of comparison: two such buffers plus the
// read-ahead's are all the memory the check holds.
const compareChunk = 2 << 20

// compareSeg compares n bytes at offset at of DST tensor ti with their
// prediction.
func compareSeg(path string, ti *safetensors.TensorInfo, sg segment, got, want []byte, at int64, foldMax *float64) *ByteMismatch {
	mm := func(kind string, off int64, detail string) *ByteMismatch {
		return &ByteMismatch{Kind: kind, File: path, Tensor: ti.Name, Layer: sg.layer, Expert: sg.expert, Offset: off, Detail: detail}
	}
	if i, bits := tensorbytes.FirstNonFinite(ti.DType, got); i >= 0 {
		es := int64(ti.DType.Size())
		return mm(MismatchNaN, at+int64(i)*es, fmt.Sprintf("element %d is NaN or Inf (bits %#x)", (at/es)+int64(i), bits))
	}
	if sg.dq != nil {
		return compareDequant(mm, sg, ti.DType, got, want, at)
	}
	if sg.fold == 0 {
		if bytes.Equal(got, want) {
			return nil
		}
		i := firstDiff(got, want)
		return mm(MismatchBytes, at+int64(i), fmt.Sprintf("DST byte %#02x, SRC %s byte %#02x", got[i], sg.src.Name, want[i]))
	}
	es := ti.DType.Size()
	rel, absFloor := weightfmt.RoundingBound(ti.DType)
	for i := 0; i+es <= len(got); i += es {
		d, s := weightfmt.Value(ti.DType, got[i:]), weightfmt.Value(ti.DType, want[i:])
		exact := s * sg.fold
		diff := math.Abs(d - exact)
		if diff > rel*math.Abs(exact)+absFloor {
			return mm(MismatchFold, at+int64(i), fmt.Sprintf("%g, but SRC %s holds %g and %g x rsf %g = %g", d, sg.src.Name, s, s, sg.fold, exact))
		}
		if exact != 0 {
			*foldMax = max(*foldMax, diff/math.Abs(exact))
		}
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// segReader reads a tensor's predicted bytes, segment after segment, from
// SRC.
type segReader struct {
	segs []segment
	seg  int
	rng  int
	pos  int64 // within the current range
	// A dequantised segment (dequant.go): the rows predicted so far, the
	// predicted bytes not yet read (dqBuf from dqOff), the scratch.
	dqRow int64
	dqBuf []byte
	dqOff int
	dq    weightfmt.Dequantiser
	io    *ioReader // the current in-out segment's, its buffers kept for the next
}

// Read fills p with the next predicted bytes; io.EOF after the last.
func (r *segReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if r.seg >= len(r.segs) {
			if n > 0 {
				return n, nil
			}
			return 0, io.EOF
		}
		sg := &r.segs[r.seg]
		if sg.dq != nil {
			m, err := r.readDequant(sg, p[n:])
			if err != nil {
				return n, err
			}
			if m == 0 {
				r.seg, r.dqRow, r.dqBuf, r.dqOff = r.seg+1, 0, r.dqBuf[:0], 0
			}
			n += m
			continue
		}
		if sg.io != nil {
			if r.io == nil {
				r.io = &ioReader{}
			}
			if r.io.g != sg.io {
				*r.io = ioReader{g: sg.io, buf: r.io.buf, tmp: r.io.tmp}
			}
			m, err := r.io.read(p[n:])
			n += m
			if err != nil {
				return n, err
			}
			if r.io.pos == sg.io.size() {
				r.seg++
			}
			continue
		}
		if r.rng >= len(sg.ranges) {
			r.seg, r.rng, r.pos = r.seg+1, 0, 0
			continue
		}
		rg := sg.ranges[r.rng]
		m := min(int64(len(p)-n), rg[1]-rg[0]-r.pos)
		if err := tensorbytes.ReadAt(sg.src, p[n:n+int(m)], rg[0]+r.pos); err != nil {
			return n, err
		}
		n += int(m)
		if r.pos += m; r.pos == rg[1]-rg[0] {
			r.rng, r.pos = r.rng+1, 0
		}
	}
	return n, nil
}

// aheadReader reads its source in a goroutine, a few chunks ahead of the
// reader, so that reading DST overlaps reading SRC and comparing.
type aheadReader struct {
	ch   chan aheadChunk
	free chan []byte
	cur  []byte
	buf  []byte
	err  error
	done chan struct{}
}

type aheadChunk struct {
	b   []byte
	err error
}

const aheadDepth = 3

func newAheadReader(r io.Reader) *aheadReader {
	a := &aheadReader{ch: make(chan aheadChunk, aheadDepth), free: make(chan []byte, aheadDepth+1), done: make(chan struct{})}
	for range aheadDepth + 1 {
		a.free <- make([]byte, compareChunk)
	}
	go func() {
		defer close(a.ch)
		for {
			var b []byte
			select {
			case b = <-a.free:
			case <-a.done:
				return
			}
			n, err := io.ReadFull(r, b)
			if err == io.ErrUnexpectedEOF {
				err = io.EOF
			}
			select {
			case a.ch <- aheadChunk{b[:n], err}:
			case <-a.done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return a
}

func (a *aheadReader) Read(p []byte) (int, error) {
	for len(a.cur) == 0 {
		if a.err != nil {
			return 0, a.err
		}
		if a.buf != nil {
			a.free <- a.buf[:cap(a.buf)]
			a.buf = nil
		}
		c, ok := <-a.ch
		if !ok {
			return 0, io.EOF
		}
		a.buf, a.cur, a.err = c.b, c.b, c.err
	}
	n := copy(p, a.cur)
	a.cur = a.cur[n:]
	return n, nil
}

func (a *aheadReader) stop() { close(a.done) }
