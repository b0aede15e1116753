package layout

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/weightfmt"
)

// dequantContract is goodContract dequantised to bf16: plain experts of
// that dtype, and the record of their FP8 source.
func dequantContract() *Contract {
	c := goodContract()
	c.Quantization, c.WeightDType, c.WeightBlockSize = "none", "BF16", nil
	c.Dequantized = &Dequantized{DType: "BF16", Rounding: weightfmt.RoundNearestEven, Groups: []DequantGroup{
		NewDequantGroup(GroupExperts, weightfmt.FP8Block(128, 128, false), 768),
		NewDequantGroup(GroupOther, weightfmt.FP8Block(128, 128, false), 5)}}
	return c
}

// A dequantised contract reads back with plain names and its source
// format per group; an inconsistent record is refused.
func TestDequantizedContract(t *testing.T) {
	read := func(c *Contract) (*Contract, error) {
		b, _ := json.Marshal(map[string]any{ContractKey: c})
		var cfg map[string]any
		json.Unmarshal(b, &cfg)
		got, _, err := ReadContract(cfg)
		return got, err
	}
	got, err := read(dequantContract())
	if err != nil {
		t.Fatal(err)
	}
	if n := got.Names(got.Layers[0]); got.Quantized() || n.Weight(ProjGateUp) != "model.layers.3.mlp.experts.gate_up_proj" || n.Get(ProjGateUp, RoleScale) != "" {
		t.Errorf("names %+v", n)
	}
	if g, ok := got.Dequantized.Group(GroupExperts); !ok || g.Quantization != weightfmt.QuantFP8Block || len(g.WeightBlockSize) != 2 {
		t.Errorf("experts group %+v", g)
	}
	for name, bad := range map[string]func(*Contract){
		"quantised":        func(c *Contract) { c.Quantization, c.WeightDType = "fp8_block_128x128", "F8_E4M3" },
		"other dtype":      func(c *Contract) { c.WeightDType = "F16" },
		"int target":       func(c *Contract) { c.Dequantized.DType, c.WeightDType = "I32", "I32" },
		"truncation":       func(c *Contract) { c.Dequantized.Rounding = "toward-zero" },
		"exact bf16":       func(c *Contract) { c.Dequantized.Rounding = weightfmt.RoundExact },
		"no groups":        func(c *Contract) { c.Dequantized.Groups = nil },
		"twice":            func(c *Contract) { c.Dequantized.Groups[1].Group = GroupExperts },
		"unknown group":    func(c *Contract) { c.Dequantized.Groups[1].Group = "attention" },
		"none dequantised": func(c *Contract) { c.Dequantized.Groups[1].Tensors = 0 },
		"plain source":     func(c *Contract) { c.Dequantized.Groups[0] = NewDequantGroup(GroupExperts, weightfmt.Plain("BF16"), 3) },
		"unknown source":   func(c *Contract) { c.Dequantized.Groups[0].Quantization = "int3" },
	} {
		c := dequantContract()
		bad(c)
		if _, err := read(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A mixed-format source: a group per (group, source format), the
	// routed experts' first; the same format twice in a group is refused.
	fp4 := weightfmt.MXFP4(weightfmt.NamingDeepSeek, "I8", "F8_E8M0")
	fp8 := weightfmt.FP8BlockDeepSeek(128, 128, "F8_E8M0")
	mixed := dequantContract()
	mixed.Dequantized.Groups = []DequantGroup{NewDequantGroup(GroupExperts, fp4, 72), NewDequantGroup(GroupExperts, fp8, 9),
		NewDequantGroup(GroupOther, fp8, 22)}
	got, err = read(mixed)
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := got.Dequantized.Group(GroupExperts); g.Quantization != weightfmt.QuantMXFP4 || g.Tensors != 72 {
		t.Errorf("mixed: experts group %+v, want the routed experts' mxfp4", g)
	}
	if g := got.Dequantized.Groups[2]; g.ScaleDType != "F8_E8M0" || g.Naming != weightfmt.NamingDeepSeek {
		t.Errorf("mixed: other group %+v, want F8_E8M0 x.scale (deepseek)", g)
	}
	mixed.Dequantized.Groups = append(mixed.Dequantized.Groups, NewDequantGroup(GroupOther, fp8, 1))
	if _, err := read(mixed); err == nil {
		t.Error("other twice in one source format: accepted")
	}
}

// FormatFields records each format as the contract's own fields do.
func TestFormatFields(t *testing.T) {
	for _, tc := range []struct {
		f            weightfmt.Format
		q, wd, scale string
		block        []int64
		naming       string
	}{
		{weightfmt.Plain("BF16"), "none", "BF16", "", nil, ""},
		{weightfmt.FP8Block(128, 128, true), "fp8_block_128x128", "F8_E4M3", "", []int64{128, 128}, ""},
		{weightfmt.FP8Channel("BF16"), "fp8_channel", "F8_E4M3", "BF16", nil, ""},
		{weightfmt.Int4Pack(32, "BF16"), "int4_pack", "I32", "BF16", []int64{1, 32}, ""},
		{weightfmt.NVFP4ModelOpt(), "nvfp4_modelopt", "U8", "", []int64{1, 16}, ""},
		{weightfmt.MXFP4(weightfmt.NamingGptOss, "U8", "U8"), "mxfp4", "U8", "", []int64{1, 32}, ""},
		{weightfmt.MXFP4(weightfmt.NamingDeepSeek, "I8", "F8_E8M0"), "mxfp4", "I8", "F8_E8M0", []int64{1, 32}, weightfmt.NamingDeepSeek},
	} {
		q, wd, block, scale, naming := FormatFields(tc.f)
		if q != tc.q || wd != tc.wd || scale != tc.scale || !reflect.DeepEqual(block, tc.block) || naming != tc.naming {
			t.Errorf("%s: %s %s %v %s %q", tc.f, q, wd, block, scale, naming)
		}
	}
}

// CONTRACT.md documents every key the contract can hold, the
// dequantized record's included.
func TestContractKeysDocumented(t *testing.T) {
	doc := testkit.ReadFile(t, "CONTRACT.md")
	for _, typ := range []reflect.Type{reflect.TypeFor[Contract](), reflect.TypeFor[Dequantized](), reflect.TypeFor[DequantGroup](), reflect.TypeFor[LayerInfo]()} {
		for i := range typ.NumField() {
			key, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if key != "" && !strings.Contains(string(doc), "`"+key+"`") {
				t.Errorf("CONTRACT.md does not document %s's key %q", typ.Name(), key)
			}
		}
	}
}
