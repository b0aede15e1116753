package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/placement"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
)

// An output prepared per rank (--ep N [--moe-tp M]): the routed experts of
// every MoE layer are written once per rank, in files under the rank's
// directory (layout.RankDir) with an index of their own; every other tensor
// goes to the shared files, as a whole-model output writes it. Rank r =
// g*M + t holds, in every MoE layer, the physical slots [g*S/N,
// (g+1)*S/N) of the placement, each slot its logical expert's bytes cut to
// the intermediate rows [t*I/M, (t+1)*I/M) (gate and up rows, down
// columns, and the scale entries that cover them); with fuse-shared, then
// its own replica of the S shared slices, cut the same way.

// maxRanks bounds N*M (layout.MaxRanks: a contract is held to the same).
const maxRanks = layout.MaxRanks

// normRanks checks the per-rank options: all of them need --ep.
func (o *Options) normRanks() error {
	if o.EP == 0 {
		switch {
		case o.MoETP != 0:
			return fmt.Errorf("--moe-tp %d needs --ep", o.MoETP)
		case o.Slots != 0 || o.PlacementStats != "" || o.PlacementMap != "" || o.Nodes != 0:
			return fmt.Errorf("--slots, --placement, --placement-map and --nodes need --ep")
		}
		return nil
	}
	if o.MoETP == 0 {
		o.MoETP = 1
	}
	switch {
	case o.EP < 1 || o.EP > maxRanks:
		return fmt.Errorf("--ep %d: want 1..%d", o.EP, maxRanks)
	case o.MoETP < 1 || o.MoETP > maxRanks/o.EP: // divided: EP*MoETP could wrap
		return fmt.Errorf("--moe-tp %d with --ep %d: want at most %d ranks in all", o.MoETP, o.EP, maxRanks)
	case o.PlacementStats != "" && o.PlacementMap != "":
		return fmt.Errorf("--placement and --placement-map contradict each other: give recorded loads to place, or a placement")
	case o.Slots < 0:
		return fmt.Errorf("--slots %d: must be positive", o.Slots)
	case o.Nodes != 0 && o.PlacementStats == "":
		return fmt.Errorf("--nodes %d applies to --placement STATS (the placement moeprep computes)", o.Nodes)
	case o.Nodes < 0 || o.Nodes > o.EP:
		return fmt.Errorf("--nodes %d with --ep %d: want 1..%d", o.Nodes, o.EP, o.EP)
	}
	if o.FuseShared {
		// Each rank holds its own replica of the shared expert and no
		// other: the replicas are the ranks.
		if o.Replicas != 0 && o.Replicas != o.EP {
			return fmt.Errorf("--replicas %d with --ep %d: each expert-parallel rank holds its own shared-expert replica, so R = N = %d", o.Replicas, o.EP, o.EP)
		}
		o.Replicas = o.EP
	}
	return nil
}

// rankPlan is where every rank's slots come from and what it holds.
type rankPlan struct {
	ep, tp, slots int
	source        string        // contiguous, stats or map (layout.ExpertParallel.Placement)
	rows          map[int][]int // MoE layer key (family.Layer.Key: a bank apart) -> slot -> logical expert
	digest        string        // of the rows, for --resume's fingerprint
	tensors       [][]*outTensor
	shards        [][]*shardPlan
}

func (rp *rankPlan) ranks() int { return rp.ep * rp.tp }

// planRanks resolves the placement of every MoE layer and checks that the
// model's experts divide as asked.
func (p *planner) planRanks() (*rankPlan, error) {
	fp, o := p.fp, p.o
	E, N, M := fp.NumExperts, o.EP, o.MoETP
	dir := p.ck.Dir
	rp := &rankPlan{ep: N, tp: M, source: "contiguous", rows: map[int][]int{}}
	moe := map[int]bool{}
	var indices []int
	for _, l := range fp.Layers {
		if l.Bank != family.NoBank && (o.PlacementStats != "" || o.PlacementMap != "") {
			// Each bank is placed as a MoE layer of its own (rows keyed
			// by Layer.Key), but the engines' placement files and recorded
			// loads have one row a decoder layer.
			return nil, fmt.Errorf("%s: --placement and --placement-map: %s (model_type %s) holds two routed banks a layer (text and vision), and a placement file has one row a layer; give --ep [--slots], which places each bank contiguously, a row of its own in the contract", dir, fp.Family, fp.ModelType)
		}
		moe[l.Index] = true
		indices = append(indices, l.Index)
	}
	if M > 1 {
		if o.Orientation == layout.InOut {
			return nil, fmt.Errorf("%s: --moe-tp %d with --orientation in-out: cutting transposed experts is not built; use one of them", dir, M)
		}
		H := int64(fp.HiddenSize)
		for _, l := range fp.Layers {
			I := int64(fp.IntermediateOf(l))
			if I%int64(M) != 0 {
				return nil, fmt.Errorf("%s: --moe-tp %d: layer %s's experts are %d wide (moe_intermediate_size), which %d does not divide", dir, M, l.Label(), I, M)
			}
			if !sliceable(p.wf, int64(M), I/int64(M), H) {
				sc, _ := p.wf.Scale()
				return nil, fmt.Errorf("%s: --moe-tp %d: layer %s's experts are %d wide, and a part of %d would cut the %s scale blocks of %dx%d: gate and up rows and down columns are cut only on block boundaries, so I/M must be a multiple of the block",
					dir, M, l.Label(), I, I/int64(M), p.wf, sc.Block[0], sc.Block[1])
			}
			if o.FuseShared && fp.NumSharedExperts > 0 && !sliceable(p.sharedFormat(), int64(fp.NumSharedExperts*M), I/int64(M), H) {
				return nil, fmt.Errorf("%s: --moe-tp %d: the shared expert's slices of %d would cut its %s scale blocks", dir, M, I/int64(M), p.sharedFormat())
			}
		}
	}
	S := o.Slots
	var m *placement.Map
	if o.PlacementMap != "" {
		var err error
		if m, err = placement.ReadMap(o.PlacementMap); err != nil {
			return nil, err
		}
		if S != 0 && S != m.Slots() {
			return nil, fmt.Errorf("%s: %d slots a layer, --slots says %d", o.PlacementMap, m.Slots(), S)
		}
		S = m.Slots()
		rp.source = "map"
	}
	if S == 0 {
		S = E
	}
	switch {
	case S < E:
		return nil, fmt.Errorf("%s: %d slots cannot hold the %d experts: slots are E plus the redundant ones", dir, S, E)
	case S%N != 0 && S == E:
		return nil, fmt.Errorf("%s: --ep %d does not divide the %d experts (num_experts); give --slots, a multiple of %d of at least %d, for redundant slots", dir, N, E, N, E)
	case S%N != 0:
		return nil, fmt.Errorf("%s: --ep %d does not divide the %d slots (%d experts + %d redundant)", dir, N, S, E, S-E)
	}
	rp.slots = S
	spec := placement.Spec{Experts: E, Slots: S, Ranks: N, Nodes: max(o.Nodes, 1), Groups: 1}
	if g := fp.NGroup; g > 1 && E%g == 0 {
		spec.Groups = g // group-limited routing: whole groups onto nodes where they divide
	}
	switch {
	case m != nil:
		for _, l := range fp.Layers {
			row, ok := m.Row(l.Index)
			if !ok && l.MTP {
				continue // contiguous below
			}
			if !ok {
				return nil, fmt.Errorf("%s: no placement for MoE layer %d: the file places layers %s, the model's MoE layers are %s", m.File, l.Index, listInts(m.Layers), listInts(indices))
			}
			if err := placement.CheckRow(row, E); err != nil {
				return nil, fmt.Errorf("%s: layer %d: %v", m.File, l.Index, err)
			}
			rp.rows[l.Key()] = row
		}
		if m.Form == placement.Schema {
			// moeprep placement writes every layer its statistics name,
			// dense ones (SGLang records them, with no load) contiguous.
			for i, l := range m.Layers {
				if !moe[l] && !slices.Equal(m.PhysicalToLogical[i], placement.Contiguous(spec).Map) {
					return nil, fmt.Errorf("%s: places layer %d, which is not one of the model's MoE layers %s", m.File, l, listInts(indices))
				}
			}
		}
	case o.PlacementStats != "":
		st, err := placement.ReadStats(o.PlacementStats)
		if err != nil {
			return nil, err
		}
		kept := &placement.Stats{File: st.File}
		for i, l := range st.Layers {
			recorded := false
			for _, v := range st.Loads[i] {
				recorded = recorded || v > 0
			}
			switch {
			case moe[l]:
				kept.Layers, kept.Loads = append(kept.Layers, l), append(kept.Loads, st.Loads[i])
			case recorded:
				return nil, fmt.Errorf("%s: layer %d has recorded loads, but the model's MoE layers are %s", st.File, l, listInts(indices))
			}
		}
		for _, l := range fp.Layers {
			if !l.MTP && !slices.Contains(kept.Layers, l.Index) {
				return nil, fmt.Errorf("%s: no recorded loads for MoE layer %d: the file records layers %s, the model's MoE layers are %s", st.File, l.Index, listInts(st.Layers), listInts(indices))
			}
		}
		if len(kept.Layers) > 0 {
			res, err := placement.Place(spec, kept)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", st.File, err)
			}
			for i, l := range res.Layers {
				rp.rows[l] = res.PhysicalToLogical[i]
			}
		}
		rp.source = "stats"
	}
	for _, l := range fp.Layers {
		if _, ok := rp.rows[l.Key()]; !ok {
			rp.rows[l.Key()] = placement.Contiguous(spec).Map
		}
	}
	h := sha256.New()
	for _, l := range fp.Layers {
		fmt.Fprintf(h, "%d %v\n", l.Key(), rp.rows[l.Key()])
	}
	rp.digest = hex.EncodeToString(h.Sum(nil))
	rp.tensors = make([][]*outTensor, rp.ranks())
	return rp, nil
}

// listInts names a list of layer indices briefly: "1, 2, 3" or "1..60 (60 layers)".
func listInts(v []int) string {
	if len(v) == 0 {
		return "none"
	}
	if len(v) <= 6 {
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = fmt.Sprint(x)
		}
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("%d..%d (%d layers)", v[0], v[len(v)-1], len(v))
}

// foldDown marks a routed expert's down projection (weight or scale) for
// the rsf fold the planner chose.
func (p *planner) foldDown(mp *mlpParts) {
	r := layout.RoleWeight
	switch p.fold.into {
	case weightfmt.FoldWeights:
	case weightfmt.FoldScales:
		r = layout.RoleScale
	default:
		return
	}
	d := &mp[layout.ProjDown][r]
	d.fold, d.factor, d.stats = true, p.fold.factor, p.st
}

// rankLayer plans one MoE layer's stacks for every rank: routed holds the
// layer's logical experts whole (checked, dequantised and folded as the
// whole-model stacks take them). It returns the shared expert's source
// tensors where fuse-shared consumes them.
func (p *planner) rankLayer(l *family.Layer, where string, routed []mlpParts, I, H int64) ([]string, error) {
	rp, fp := p.ranks, p.fp
	M := int64(rp.tp)
	Ir := I / M // planRanks checked it divides
	cut := make([][]mlpParts, M)
	if M == 1 {
		cut[0] = routed
	} else {
		for t := range M {
			cut[t] = make([]mlpParts, len(l.Experts))
			for e, m := range l.Experts {
				what := fmt.Sprintf("%s expert %d part %d of %d", where, e, t, M)
				sp, err := p.sharedSlice(m, what, Ir, H, M, t, p.wf)
				if err != nil {
					return nil, err
				}
				if err := p.cutBiases(&sp, m, what, Ir, H, t); err != nil {
					return nil, err
				}
				if sp, err = p.dequantMLP(sp, p.wf, Ir, H, what); err != nil {
					return nil, err
				}
				p.foldDown(&sp)
				cut[t][e] = sp
			}
		}
	}
	var consumed []string
	var shared [][]mlpParts // [t][s]: slice s of the shared expert, part t
	if p.o.FuseShared {
		S := int64(fp.NumSharedExperts)
		sh := *l.Shared
		if p.requant {
			var err error
			if sh, err = p.requantMLP(sh); err != nil {
				return nil, err
			}
		}
		sf := p.sharedFormat()
		if _, scaled := sf.Scale(); scaled && p.o.DType != "" && sf != p.wf {
			p.dq.sharedApart += 3
			p.dq.sharedF = sf
		} else if scaled && p.o.DType != "" {
			p.dq.experts += 3
		}
		shared = make([][]mlpParts, M)
		for t := range M {
			for s := range S {
				what := where + " shared expert"
				sp, err := p.sharedSlice(sh, what, Ir, H, S*M, s*M+t, sf)
				if err != nil {
					return nil, err
				}
				if sp, err = p.dequantMLP(sp, sf, Ir, H, what); err != nil {
					return nil, err
				}
				shared[t] = append(shared[t], sp)
			}
		}
		consumed = l.Shared.Names()
	}
	row := rp.rows[l.Key()]
	per := rp.slots / rp.ep
	for r := range rp.ranks() {
		g, t := r/rp.tp, r%rp.tp
		bank := make([]mlpParts, 0, per+len(shared))
		for j := range per {
			bank = append(bank, cut[t][row[g*per+j]]) // a replica is a copy of the same regions
		}
		if shared != nil {
			bank = append(bank, shared[t]...)
		}
		outs, err := p.stacks(l.Prefix, bank, Ir, H, p.out.DType(), fp.RoutedAct(*l).Ungated())
		if err != nil {
			return nil, fmt.Errorf("%s: %s rank %d: %w", p.ck.Dir, where, r, err)
		}
		rp.tensors[r] = append(rp.tensors[r], outs...)
	}
	return consumed, nil
}

// cutBiases gives MoE-TP part t of routed expert m (intermediate Ir a
// part) its biases, where it has them (gpt-oss): the gate and up biases'
// rows [t*Ir, (t+1)*Ir), like their weights; the down bias, which each
// part's partial output would add again before the parts are summed, whole
// on part 0 and zeros on the others, so the sum adds it once. That is
// vLLM's rule for gpt-oss's w2_bias under tensor parallelism (loaded on TP
// rank 0, zeroed elsewhere); layout/CONTRACT.md states it for loaders.
func (p *planner) cutBiases(sp *mlpParts, m family.MLP, what string, Ir, H, t int64) error {
	if m.Get(layout.ProjGate, layout.RoleBias) == "" {
		return nil
	}
	for _, pj := range layout.MLPProjs {
		name := m.Get(pj, layout.RoleBias)
		b, ok := p.tensor(name)
		if !ok {
			return fmt.Errorf("%s: %s %s bias: tensor %s is missing", p.ck.Dir, what, pj, name)
		}
		es := int64(b.DType.Size())
		switch {
		case pj != layout.ProjDown: // checked [I] by sharedSlice's expert
			sp[pj][layout.RoleBias] = piece(b, weightfmt.Region{Off: t * Ir * es, Rows: 1, RowLen: Ir * es, Stride: Ir * es})
		case t == 0:
			sp[pj][layout.RoleBias] = whole(b)
		default:
			n := H * es
			sp[pj][layout.RoleBias] = part{region: region{src: zeroBytes{}, file: b.File, tensor: name + " (zeros: the down bias is on MoE-TP part 0)", rows: 1, rowLen: n, stride: n}, dtype: b.DType}
		}
	}
	return nil
}

// zeroBytes reads as zeros: the down bias of the MoE-TP parts past 0.
type zeroBytes struct{}

func (zeroBytes) ReadAt(b []byte, _ int64) (int, error) {
	clear(b)
	return len(b), nil
}

// shardRanks packs every rank's stacks into files under its directory.
func (op *outPlan) shardRanks(rp *rankPlan, max int64) error {
	rp.shards = make([][]*shardPlan, rp.ranks())
	for r, ts := range rp.tensors {
		ss, err := planShards(ts, max, layout.RankDir(r, rp.ranks()))
		if err != nil {
			return err
		}
		rp.shards[r] = ss
		op.shards = append(op.shards, ss...)
		op.rankTensors = append(op.rankTensors, ts...)
	}
	return nil
}

// record is the contract's expert_parallel object.
func (rp *rankPlan) record(fp *family.Plan) *layout.ExpertParallel {
	n := rp.ranks()
	x := &layout.ExpertParallel{EP: rp.ep, MoETP: rp.tp, Ranks: n, Slots: rp.slots, SlotsPerRank: rp.slots / rp.ep,
		Placement: rp.source, SharedIndex: safetensors.IndexFileName}
	for _, l := range fp.Layers {
		x.PhysicalToLogical = append(x.PhysicalToLogical, rp.rows[l.Key()])
	}
	I := int64(fp.MoEIntermediateSize)
	for r := range n {
		g, t := r/rp.tp, r%rp.tp
		ri := layout.RankInfo{Rank: r, EPRank: g, MoETPRank: t, FirstSlot: g * x.SlotsPerRank, Index: layout.RankIndex(r, n)}
		if I > 0 {
			w := I / int64(rp.tp)
			ri.Intermediate = [2]int64{int64(t) * w, int64(t+1) * w}
		}
		for _, s := range rp.shards[r] {
			ri.Files = append(ri.Files, s.name)
		}
		x.RankFiles = append(x.RankFiles, ri)
	}
	return x
}

// rankIndexNames are the per-rank index files, relative to DST.
func (op *outPlan) rankIndexNames() []string {
	if op.ranks == nil {
		return nil
	}
	var out []string
	for r := range op.ranks.ranks() {
		out = append(out, layout.RankIndex(r, op.ranks.ranks()))
	}
	return out
}

// makeRankDirs creates the rank directories under dir.
func (op *outPlan) makeRankDirs(dir string) error {
	if op.ranks == nil {
		return nil
	}
	for r := range op.ranks.ranks() {
		if err := os.MkdirAll(filepath.Join(dir, layout.RankDir(r, op.ranks.ranks())), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// writeRankIndexes writes each rank's index under dir (its weight_map
// names files relative to the rank's directory, as a loader opening that
// directory expects), adds them to files and returns their paths.
func (op *outPlan) writeRankIndexes(dir string, files map[string]layout.FileInfo) ([]string, error) {
	if op.ranks == nil {
		return nil, nil
	}
	var paths []string
	n := op.ranks.ranks()
	for r, ss := range op.ranks.shards {
		idx := &safetensors.Index{Metadata: map[string]any{}, WeightMap: map[string]string{}}
		var total int64
		for _, s := range ss {
			for _, t := range s.tensors {
				idx.WeightMap[t.name] = path.Base(s.name)
				total += t.size
			}
		}
		idx.Metadata["total_size"] = total
		name := layout.RankIndex(r, n)
		p := filepath.Join(dir, filepath.FromSlash(name))
		ib, err := safetensors.EncodeIndex(idx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		fi, err := writeFile(p, ib)
		if err != nil {
			return nil, err
		}
		files[name] = fi
		paths = append(paths, p)
	}
	return paths, nil
}

// rankBytes is each rank's file bytes (shards), for --dry-run.
func (op *outPlan) rankBytes() []int64 {
	if op.ranks == nil {
		return nil
	}
	out := make([]int64, op.ranks.ranks())
	for r, ss := range op.ranks.shards {
		for _, s := range ss {
			out[r] += s.size
		}
	}
	return out
}

// rankFingerprint is what --resume's fingerprint adds for a per-rank run.
func (o *Options) rankFingerprint(op *outPlan) string {
	if op.ranks == nil {
		return ""
	}
	b, _ := json.Marshal([]any{o.EP, o.MoETP, op.ranks.slots, op.ranks.source, op.ranks.digest})
	return "ranks " + string(b) + "\n"
}

// rankFile reports whether the shard is one of a rank's, not shared.
func (s *shardPlan) rankFile() bool { return path.Dir(s.name) != "." }
