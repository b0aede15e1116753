package validate

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/safetensors"
)

// TestContractMisfitExitsOne (issue 41): a DST whose contract does not fit
// SRC, or breaks the contract's own rules, is a DST that is wrong, not an
// input validate cannot read: each edit, as someone who can write DST
// would make it (the manifest rehashed), exits 1 naming the contract key,
// with the byte proof alone (--bytes), with the layer checks and the proof
// (the default) and with the layer checks alone (--skip-bytes). The first
// six are the issue's; the rest are contract edits the layer checks meet
// before the proof (a stack the contract names that DST lacks, a bank of
// another size, a layer's prefix), named by the proof where it runs.
func TestContractMisfitExitsOne(t *testing.T) {
	int4 := synthFrom(t, int4Specs(), "kimi-g32")
	longcat := filepath.Join(hfFixtures, "longcat-flash")
	ds := filepath.Join(hfFixtures, "deepseek-v3-bf16")
	cases := []struct {
		name    string
		src     string
		o       convert.Options
		edit    func(c map[string]any)
		want    string // in the error
		wantOff string // in the error with --skip-bytes, where not want
	}{
		{"requantisation divisor", int4, convert.Options{FuseShared: true, RequantizeShared: true}, func(c map[string]any) {
			c["shared_requantized"].(map[string]any)["scale_divisor"] = 7.0
		}, "shared_requantized.scale_divisor", ""},
		{"orientation in-out on INT4", int4, convert.Options{}, func(c map[string]any) {
			c["orientation"] = string(layout.InOut)
		}, "orientation in-out", ""},
		{"dequantized.dtype", int4, convert.Options{DType: safetensors.BF16}, func(c map[string]any) {
			c["dequantized"].(map[string]any)["dtype"] = "F16"
		}, "dequantized.dtype", ""},
		{"dequantized.dtype, another rounding", int4, convert.Options{DType: safetensors.BF16}, func(c map[string]any) {
			c["dequantized"].(map[string]any)["dtype"] = "F32"
		}, "dequantized.dtype F32", ""},
		{"dequantized.rounding", int4, convert.Options{DType: safetensors.BF16}, func(c map[string]any) {
			c["dequantized"].(map[string]any)["rounding"] = "exact"
		}, "dequantized.rounding", ""},
		{"zero_experts changed", longcat, convert.Options{}, func(c map[string]any) {
			c["zero_experts"] = 3
		}, "zero_experts", ""},
		{"zero_experts removed", longcat, convert.Options{}, func(c map[string]any) {
			delete(c, "zero_experts")
		}, "zero_experts", ""},
		{"layout", ds, convert.Options{}, func(c map[string]any) {
			c["layout"] = string(layout.GateUp)
		}, "model.layers.1.mlp.experts.all_gate.weight: unexpected: neither a stack the contract names", "tensor model.layers.1.mlp.experts.down_proj is missing"},
		{"shared replicas", ds, convert.Options{FuseShared: true, TP: 2}, func(c map[string]any) {
			c["shared_replicas"], c["num_fused_shared_experts"] = 1, 1
		}, "all_gate.weight (layer 1): dtype or shape: BF16 [18 32 160], want BF16 [17 32 160]", "holds 18 experts, the contract says 16 routed + 1 fused shared"},
		{"layer prefix", ds, convert.Options{}, func(c map[string]any) {
			c["layers"].([]any)[0].(map[string]any)["prefix"] = "model.layers.9.mlp"
		}, `moeprep.layers[0] is {"index":1,"prefix":"model.layers.9.mlp"}`, `layer 1: contract prefix "model.layers.9.mlp"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := convertInto(t, tc.src, tc.o)
			forgeContract(t, dst, tc.edit)
			for _, bytes := range []BytesMode{BytesOnly, BytesAuto, BytesOff} {
				rep, err := Run(context.Background(), Options{Src: tc.src, Dst: dst, Bytes: bytes, Tokens: 8, Seed: 1})
				if err == nil {
					err = rep.Err()
				}
				if err == nil {
					t.Fatalf("bytes %s: passed", bytes)
				}
				want := tc.want
				if bytes == BytesOff && tc.wantOff != "" {
					want = tc.wantOff
				}
				if code := exitcode.Code(err); code != exitcode.CheckFailed || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
					t.Errorf("bytes %s: exit %d, %v; want exit 1 naming %q in one line", bytes, code, err, want)
					continue
				}
				t.Logf("bytes %s: %v", bytes, err)
			}
		})
	}
}
