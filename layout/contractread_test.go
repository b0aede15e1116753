package layout

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestReadContractInvalid: a contract that decodes in this version but
// breaks the rules is an *InvalidContractError (validate: a DST that is
// wrong, exit 1); one that does not decode, or is of another version, is
// not (input this moeprep cannot read, exit 2). The text is Check's either
// way, naming the key.
func TestReadContractInvalid(t *testing.T) {
	read := func(v any) error {
		b, _ := json.Marshal(map[string]any{ContractKey: v})
		var cfg map[string]any
		json.Unmarshal(b, &cfg)
		_, ok, err := ReadContract(cfg)
		if !ok || err == nil {
			t.Fatalf("%v: ok %v err %v", v, ok, err)
		}
		return err
	}
	for _, tc := range []struct {
		name    string
		edit    func(c *Contract)
		invalid bool
		want    string
	}{
		{"layout", func(c *Contract) { c.Layout = "diag" }, true, `unknown layout "diag"`},
		{"rounding", func(c *Contract) {
			c.Quantization, c.WeightDType, c.WeightBlockSize = "none", "BF16", nil
			c.Dequantized = &Dequantized{DType: "BF16", Rounding: "exact", Groups: []DequantGroup{{Group: GroupExperts, Quantization: "fp8_block_128x128",
				WeightDType: "F8_E4M3", WeightBlockSize: []int64{128, 128}, Tensors: 3}}}
		}, true, `dequantized.rounding "exact" with dequantized.dtype BF16`},
		{"version", func(c *Contract) { c.Version = 2 }, false, "version 2"},
	} {
		c := goodContract()
		tc.edit(c)
		err := read(c)
		var bad *InvalidContractError
		if errors.As(err, &bad) != tc.invalid || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v (invalid %v), want invalid %v and %q", tc.name, err, errors.As(err, &bad), tc.invalid, tc.want)
		}
	}
	var bad *InvalidContractError
	if err := read("yes"); errors.As(err, &bad) {
		t.Errorf("a contract that does not decode: %v is invalid, not unreadable", err)
	}
}
