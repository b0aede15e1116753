package layout

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/weightfmt"
	"github.com/zeebo/blake3"
	"github.com/zeebo/xxh3"
)

// Parse takes every layout's name in any case, and "" as the default
// (stacked); nothing else.
func TestParse(t *testing.T) {
	for _, l := range Layouts {
		for _, in := range []string{string(l), strings.ToUpper(string(l))} {
			if got, err := Parse(in); got != l || err != nil {
				t.Errorf("Parse(%q) = %q, %v, want %q", in, got, err, l)
			}
		}
	}
	if got, err := Parse(""); got != Stacked || err != nil {
		t.Errorf("Parse(\"\") = %q, %v, want stacked", got, err)
	}
	for _, in := range []string{"gate_up", "x"} {
		if got, err := Parse(in); got != "" || err == nil {
			t.Errorf("Parse(%q) = %q, %v, want an error", in, got, err)
		}
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		l      Layout
		prefix string
		fp8    bool
		want   ExpertTensors
	}{
		{Stacked, "model.layers.3.mlp", true, ExpertTensors{Layout: Stacked, Prefix: "model.layers.3.mlp.experts", Tensors: Tensors{
			ProjGate: {RoleWeight: "model.layers.3.mlp.experts.all_gate.weight", RoleScale: "model.layers.3.mlp.experts.all_gate.weight_scale_inv"},
			ProjUp:   {RoleWeight: "model.layers.3.mlp.experts.all_up.weight", RoleScale: "model.layers.3.mlp.experts.all_up.weight_scale_inv"},
			ProjDown: {RoleWeight: "model.layers.3.mlp.experts.all_down.weight", RoleScale: "model.layers.3.mlp.experts.all_down.weight_scale_inv"}}}},
		{Stacked, "model.layers.0.block_sparse_moe", false, ExpertTensors{Layout: Stacked, Prefix: "model.layers.0.block_sparse_moe.experts", Tensors: Tensors{
			ProjGate: {RoleWeight: "model.layers.0.block_sparse_moe.experts.all_gate.weight"},
			ProjUp:   {RoleWeight: "model.layers.0.block_sparse_moe.experts.all_up.weight"},
			ProjDown: {RoleWeight: "model.layers.0.block_sparse_moe.experts.all_down.weight"}}}},
		{GateUp, "model.layers.3.mlp", true, ExpertTensors{Layout: GateUp, Prefix: "model.layers.3.mlp.experts", Tensors: Tensors{
			ProjGateUp: {RoleWeight: "model.layers.3.mlp.experts.gate_up_proj", RoleScale: "model.layers.3.mlp.experts.gate_up_proj_scale_inv"},
			ProjDown:   {RoleWeight: "model.layers.3.mlp.experts.down_proj", RoleScale: "model.layers.3.mlp.experts.down_proj_scale_inv"}}}},
		{GateUp, "model.layers.0.block_sparse_moe", false, ExpertTensors{Layout: GateUp, Prefix: "model.layers.0.mlp.experts", Tensors: Tensors{
			ProjGateUp: {RoleWeight: "model.layers.0.mlp.experts.gate_up_proj"},
			ProjDown:   {RoleWeight: "model.layers.0.mlp.experts.down_proj"}}}},
		{UpGate, "model.layers.1.mlp", false, ExpertTensors{Layout: UpGate, Prefix: "model.layers.1.mlp.experts", Tensors: Tensors{
			ProjGateUp: {RoleWeight: "model.layers.1.mlp.experts.up_gate_proj"},
			ProjDown:   {RoleWeight: "model.layers.1.mlp.experts.down_proj"}}}},
	} {
		if got := Names(tc.l, tc.prefix, tc.fp8); got != tc.want {
			t.Errorf("Names(%s, %s, %v) =\n %+v\nwant\n %+v", tc.l, tc.prefix, tc.fp8, got, tc.want)
		}
	}
}

func TestStackShapes(t *testing.T) {
	s := StackShapes(Stacked, 257, 2048, 7168, true, 128, 128)
	if !eq(s.Gate, 257, 2048, 7168) || !eq(s.Down, 257, 7168, 2048) || !eq(s.GateScale, 257, 16, 56) || !eq(s.DownScale, 257, 56, 16) {
		t.Errorf("stacked %+v", s)
	}
	// I not a multiple of 128: two stacked grids of ceil(I/128) rows, not ceil(2I/128)
	f := StackShapes(GateUp, 4, 192, 320, true, 128, 128)
	if !eq(f.GateUp, 4, 384, 320) || !eq(f.GateUpScale, 4, 4, 3) || !eq(f.DownScale, 4, 3, 2) || f.Gate != nil {
		t.Errorf("gate-up %+v", f)
	}
	if n := StackShapes(UpGate, 4, 16, 24, false, 128, 128); n.GateUpScale != nil || !eq(n.GateUp, 4, 32, 24) {
		t.Errorf("up-gate bf16 %+v", n)
	}
}

// The names and shapes follow the format's scale: its suffix, its grid
// (ceil for partial blocks), none for plain weights; and a contract's
// format is what its quantization, dtype and block say.
func TestNamesAndShapesFor(t *testing.T) {
	fp8 := weightfmt.FP8Block(64, 32, false)
	n := NamesFor(GateUp, "model.layers.2.mlp", fp8)
	if n.Get(ProjGateUp, RoleScale) != "model.layers.2.mlp.experts.gate_up_proj_scale_inv" || n.Get(ProjDown, RoleScale) != "model.layers.2.mlp.experts.down_proj_scale_inv" {
		t.Errorf("gate-up FP8 scale names %+v", n)
	}
	if p := NamesFor(Stacked, "model.layers.2.mlp", weightfmt.Plain(safetensors.BF16)); p.Get(ProjGate, RoleScale) != "" || p.Get(ProjDown, RoleScale) != "" || p.Weight(ProjGate) == "" {
		t.Errorf("stacked bf16 names %+v", p)
	}
	s := StackShapesFor(Stacked, 3, 100, 70, fp8)
	if !eq(s.GateScale, 3, 2, 3) || !eq(s.UpScale, 3, 2, 3) || !eq(s.DownScale, 3, 2, 4) {
		t.Errorf("stacked 64x32 blocks, I=100 H=70: %+v", s)
	}
	if g := StackShapesFor(UpGate, 3, 100, 70, fp8); !eq(g.GateUpScale, 3, 4, 3) || !eq(g.DownScale, 3, 2, 4) {
		t.Errorf("up-gate 64x32 blocks, I=100 H=70: %+v", g)
	}
	if p := StackShapesFor(Stacked, 3, 100, 70, weightfmt.Plain(safetensors.F16)); p.GateScale != nil || p.DownScale != nil {
		t.Errorf("stacked f16 shapes %+v", p)
	}
	c := goodContract()
	c.WeightBlockSize = []int64{64, 32}
	if f, err := c.Format(); err != nil || f != fp8 {
		t.Errorf("FP8 contract with 64x32 blocks: %v %v", f, err)
	}
	c.Quantization, c.WeightDType, c.WeightBlockSize = "none", "BF16", nil
	if f, err := c.Format(); err != nil || f != weightfmt.Plain(safetensors.BF16) || c.Names(c.Layers[0]).Get(ProjDown, RoleScale) != "" {
		t.Errorf("bf16 contract: %v %v", f, err)
	}
}

func eq(s Shape, v ...int64) bool { return slices.Equal(s, v) }

func TestSharedSlotID(t *testing.T) {
	// E=256, R=8, S=1: token t uses expert 256 + t%8
	for tk, want := range map[int]int{0: 256, 7: 263, 8: 256, 13: 261} {
		if got := SharedSlotID(256, 8, 1, tk, 0); got != want {
			t.Errorf("SharedSlotID(256,8,1,%d,0) = %d, want %d", tk, got, want)
		}
	}
	// E=160, R=2, S=2: ids 160..163, replica-major
	if got := SharedSlotID(160, 2, 2, 3, 1); got != 163 {
		t.Errorf("got %d want 163", got)
	}
	if got := SharedSlotID(160, 2, 2, 4, 1); got != 161 {
		t.Errorf("got %d want 161", got)
	}
}

func goodContract() *Contract {
	return &Contract{Version: 1, Layout: GateUp, SourceFormat: "safetensors", Family: "deepseek", NumExperts: 256,
		NumFusedSharedExperts: 8, SharedReplicas: 8, SharedSlices: 1, SharedFirstID: 256, SharedSlotWeight: 1,
		RoutedScalingFactor: 2.5, RoutedScalingFactorFolded: true, FoldMode: FoldAuto, TP: 8, WeightDType: "F8_E4M3",
		Quantization: "fp8_block_128x128", WeightBlockSize: []int64{128, 128},
		Layers: []LayerInfo{{Index: 3, Prefix: "model.layers.3.mlp"}}, Manifest: ManifestFileName}
}

func TestReadContract(t *testing.T) {
	c := goodContract()
	b, _ := json.Marshal(map[string]any{"model_type": "deepseek_v3", ContractKey: c})
	var cfg map[string]any
	json.Unmarshal(b, &cfg)
	got, ok, err := ReadContract(cfg)
	if err != nil || !ok || got.BankSize() != 264 || got.RuntimeScale() != 1 || !got.Quantized() ||
		got.Names(got.Layers[0]).Weight(ProjGateUp) != "model.layers.3.mlp.experts.gate_up_proj" {
		t.Fatalf("ReadContract: %+v %v %v", got, ok, err)
	}
	if _, ok, err := ReadContract(map[string]any{"model_type": "x"}); ok || err != nil {
		t.Errorf("no contract: ok %v err %v", ok, err)
	}
	for _, bad := range []func(*Contract){
		func(c *Contract) { c.Version = 2 },
		func(c *Contract) { c.Layout = "diag" },
		func(c *Contract) { c.NumFusedSharedExperts = 7 },
		func(c *Contract) { c.SharedFirstID = 3 },
		func(c *Contract) { c.SharedSlotWeight = 0 },
		func(c *Contract) { c.WeightBlockSize = nil },
		func(c *Contract) { c.NumExperts = 0 },
		func(c *Contract) { c.Quantization = "int4_group_32" }, // a format moeprep does not know
		// activations: not finite or negative, or a fused shared slot (one
		// bank, one activation) whose shared MLP runs another
		func(c *Contract) { c.SharedActivation = &Activation{Limit: -1} },
		func(c *Contract) { c.Layers[0].Activation = &Activation{ClampAfter: true} },
		func(c *Contract) { c.SharedActivation = &Activation{Limit: 7} },
		func(c *Contract) { c.Layers[0].SharedActivation = &Activation{Limit: 7, ClampAfter: true} },
	} {
		c := goodContract()
		bad(c)
		b, _ := json.Marshal(map[string]any{ContractKey: c})
		var cfg map[string]any
		json.Unmarshal(b, &cfg)
		if _, ok, err := ReadContract(cfg); !ok || err == nil {
			t.Errorf("bad contract %+v accepted", c)
		}
	}
	if _, ok, err := ReadContract(map[string]any{ContractKey: "yes"}); !ok || err == nil {
		t.Errorf("string contract: ok %v err %v", ok, err)
	}
}

func TestManifestVerify(t *testing.T) {
	dir := t.TempDir()
	testkit.WriteFile(t, filepath.Join(dir, "a"), []byte("hello"))
	fi, err := HashFile(filepath.Join(dir, "a"))
	if err != nil || fi.Size != 5 || fi.SHA256 != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Fatalf("HashFile: %+v %v", fi, err)
	}
	m := &Manifest{Version: 1, Files: map[string]FileInfo{"a": fi}}
	b, _ := json.Marshal(m)
	testkit.WriteFile(t, filepath.Join(dir, ManifestFileName), b)
	m2, err := ReadManifest(dir)
	if err != nil || m2.Verify(dir) != nil {
		t.Fatalf("ReadManifest/Verify: %v", err)
	}
	testkit.WriteFile(t, filepath.Join(dir, "a"), []byte("hellp"))
	if err := m2.Verify(dir); err == nil || !strings.Contains(err.Error(), "manifest says") {
		t.Errorf("changed file not caught: %v", err)
	}
}

func TestBlockDigests(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte(i*7 + i/256)
	}
	path := filepath.Join(dir, "f")
	testkit.WriteFile(t, path, data)
	// The definitions, written out: the hash of the concatenated block hashes.
	xxh128 := func(b []byte) (d [32]byte) {
		c := xxh3.Hash128(b).Bytes()
		copy(d[:], c[:])
		return d
	}
	algos := []struct {
		algo BlockAlgo
		sum  func([]byte) [32]byte
		like func(bs int64) FileInfo
		get  func(FileInfo) BlockDigest
	}{
		{SHA256Blocks, sha256.Sum256, func(bs int64) FileInfo { return FileInfo{Blocks: BlockDigest{BlockSize: bs}} },
			func(f FileInfo) BlockDigest { return f.Blocks }},
		{BLAKE3Blocks, blake3.Sum256, func(bs int64) FileInfo { return FileInfo{B3Blocks: BlockDigest{BlockSize: bs}} },
			func(f FileInfo) BlockDigest { return f.B3Blocks }},
		{XXH3Blocks, xxh128, func(bs int64) FileInfo { return FileInfo{X3Blocks: BlockDigest{BlockSize: bs}} },
			func(f FileInfo) BlockDigest { return f.X3Blocks }},
	}
	roots := map[string]bool{}
	for _, a := range algos {
		for _, bs := range []int64{1, 4096, 5000, 10000, 1 << 20} {
			like := a.like(bs)
			got, err := HashFileLike(path, like)
			if err != nil {
				t.Fatal(err)
			}
			var cat []byte
			for off := int64(0); off < int64(len(data)); off += bs {
				d := a.sum(data[off:min(off+bs, int64(len(data)))])
				cat = append(cat, d[:a.algo.Size()]...)
			}
			root := a.sum(cat)
			want := like
			want.Size = 10000
			rootHex := hex.EncodeToString(root[:a.algo.Size()])
			switch a.algo {
			case SHA256Blocks:
				want.Blocks.Root = rootHex
			case BLAKE3Blocks:
				want.B3Blocks.Root = rootHex
			default:
				want.X3Blocks.Root = rootHex
			}
			if got != want {
				t.Errorf("%s, block size %d: %+v, want %+v", a.algo, bs, got, want)
			}
			roots[a.get(got).Root] = true
			// Streamed in uneven writes, the Hasher agrees.
			h := NewHasher(like)
			for off := 0; off < len(data); off += 333 {
				h.Write(data[off:min(off+333, len(data))])
			}
			if s := h.Sum(); s != got {
				t.Errorf("%s, block size %d: Hasher %+v, HashFileLike %+v", a.algo, bs, s, got)
			}
		}
	}
	// 10000 and 1 MiB both make one block of the whole file: 4 roots each.
	if len(roots) != 12 {
		t.Errorf("%d distinct roots, want 3 algorithms x 4 block layouts", len(roots))
	}
	whole, _ := HashFile(path)
	h := NewHasher(FileInfo{SHA256: "x"})
	h.Write(data)
	if h.Sum() != whole {
		t.Errorf("whole-file Hasher %+v, HashFile %+v", h.Sum(), whole)
	}
	// A changed byte in the last, short block is caught, in either form.
	for _, like := range []FileInfo{{Blocks: BlockDigest{BlockSize: 4096}}, {B3Blocks: BlockDigest{BlockSize: 4096}}, {X3Blocks: BlockDigest{BlockSize: 4096}}} {
		testkit.WriteFile(t, path, data)
		fi, _ := HashFileLike(path, like)
		m := &Manifest{Version: ContractVersion, Files: map[string]FileInfo{"f": fi}}
		if err := m.Verify(dir); err != nil {
			t.Fatal(err)
		}
		bad := bytes.Clone(data)
		bad[9999] ^= 1
		testkit.WriteFile(t, path, bad)
		if err := m.Verify(dir); err == nil || !strings.Contains(err.Error(), "4096-byte blocks") {
			t.Errorf("%+v: changed byte not caught: %v", like, err)
		}
	}
}

func TestReadManifestRefusesBadEntries(t *testing.T) {
	for name, entry := range map[string]string{
		"neither":         `{"size": 5}`,
		"both":            `{"size": 5, "sha256": "ab", "sha256_blocks": {"block_size": 16, "root": "cd"}}`,
		"negative size":   `{"size": -1, "sha256": "ab"}`,
		"negative blocks": `{"size": 5, "sha256_blocks": {"block_size": -16, "root": "cd"}}`,
		"both blocks":     `{"size": 5, "blake3_blocks": {"block_size": 16, "root": "ab"}, "sha256_blocks": {"block_size": 16, "root": "cd"}}`,
		"sha and blake3":  `{"size": 5, "sha256": "ab", "blake3_blocks": {"block_size": 16, "root": "cd"}}`,
		"huge blake3":     `{"size": 5, "blake3_blocks": {"block_size": 1099511627777, "root": "cd"}}`,
		"xxh3 and blake3": `{"size": 5, "xxh3_blocks": {"block_size": 16, "root": "ab"}, "blake3_blocks": {"block_size": 16, "root": "cd"}}`,
		"negative xxh3":   `{"size": 5, "xxh3_blocks": {"block_size": -1, "root": "cd"}}`,
	} {
		dir := t.TempDir()
		testkit.WriteFile(t, filepath.Join(dir, ManifestFileName), []byte(`{"version": 1, "files": {"a": `+entry+`}}`))
		if _, err := ReadManifest(dir); err == nil || !strings.Contains(err.Error(), "file a") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestXXH3Canonical pins the digest bytes to what `xxhsum -H2` (xxHash 0.8.1)
// prints, so a shard's xxh3_blocks can be checked by hand with that tool
// (layout/CONTRACT.md).
func TestXXH3Canonical(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"moeprep", "19e684b3f93a2318634c40d66e37f197"}, // printf moeprep | xxhsum -H2
	} {
		h := XXH3Blocks.New()
		h.Write([]byte(tc.in))
		if got := hex.EncodeToString(h.Sum(nil)); got != tc.want || h.Size() != 16 {
			t.Errorf("%q: %s (size %d), want %s", tc.in, got, h.Size(), tc.want)
		}
	}
}

func TestParseBlockAlgo(t *testing.T) {
	for _, a := range []BlockAlgo{XXH3Blocks, BLAKE3Blocks, SHA256Blocks} {
		if got, err := ParseBlockAlgo(a.String()); err != nil || got != a {
			t.Errorf("%s: %v %v", a, got, err)
		}
	}
	if _, err := ParseBlockAlgo("md5"); err == nil || !strings.Contains(err.Error(), "md5") {
		t.Errorf("md5: %v", err)
	}
}

// TestOrientation: parsing, the in-out shapes (the last two dimensions of
// every weight and grid stack swapped, per-expert scalars kept) and the
// contracts that are refused.
func TestOrientation(t *testing.T) {
	for in, want := range map[string]Orientation{"": OutIn, "out-in": OutIn, "IN-OUT": InOut} {
		if got, err := ParseOrientation(in); got != want || err != nil {
			t.Errorf("%q: %q %v", in, got, err)
		}
	}
	if _, err := ParseOrientation("kmajor"); err == nil || !strings.Contains(err.Error(), "out-in or in-out") {
		t.Errorf("kmajor: %v", err)
	}
	fp8 := weightfmt.FP8Block(128, 128, false)
	s := StackShapesFor(GateUp, 10, 200, 384, fp8).Oriented(InOut)
	if fmt.Sprint(s.GateUp, s.GateUpScale, s.Down, s.DownScale) != "[10 384 400] [10 3 4] [10 200 384] [10 2 3]" {
		t.Errorf("gate-up in-out: %v %v %v %v", s.GateUp, s.GateUpScale, s.Down, s.DownScale)
	}
	if o := StackShapesFor(Stacked, 10, 200, 384, nil); !reflect.DeepEqual(o.Oriented(OutIn), o) {
		t.Error("out-in changed the shapes")
	}
	int4 := func(c *Contract) {
		c.Quantization, c.WeightDType, c.WeightBlockSize, c.ScaleDType = "int4_pack", "I32", []int64{1, 32}, "BF16"
	}
	for want, bad := range map[string]func(*Contract){
		`unknown orientation "diagonal"`: func(c *Contract) { c.Orientation = "diagonal" },
		"orientation in-out, but INT4 (int4_pack) packs 8 elements per unit along each row": func(c *Contract) { int4(c); c.Orientation = InOut },
		"": int4,
	} {
		c := goodContract()
		bad(c)
		if err := c.Check(); want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: %v", want, err)
		}
	}
	c := goodContract()
	c.Orientation = InOut
	if err := c.Check(); err != nil || c.Shapes(3, 128, 256).GateUp[1] != 256 {
		t.Errorf("in-out FP8 contract: %v", err)
	}
	if why := TransposeRefusal(nil); why != "" {
		t.Errorf("unquantised: %s", why)
	}
}
