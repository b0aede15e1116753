package validate

import (
	"context"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/convert"
)

// TestLongcatContractAndBias: a DST whose contract loses zero_experts is
// refused naming it; one zero-compute row's correction bias changed in DST
// fails the numbers (the fused path ranks with DST's) and the byte proof.
func TestLongcatContractAndBias(t *testing.T) {
	src := hfFixtures + "/longcat-flash"
	dst := convertInto(t, src, convert.Options{})
	rep, err := Run(context.Background(), Options{Src: src, Dst: dst, Golden: src, Seed: 1})
	if err != nil || rep.Failed() {
		t.Fatalf("clean conversion: %v %v", err, rep.Err())
	}
	biasDst := convertInto(t, src, convert.Options{})
	rewriteTensor(t, biasDst, "model.layers.1.mlp.router.e_score_correction_bias", func(raw []byte, _ []int64) {
		raw[4*9+3] ^= 0x40 // row 9, a zero-compute expert's: a large bias, it wins every token's top-k
	})
	for _, bytes := range []BytesMode{BytesOff, BytesOnly} {
		rep, err := Run(context.Background(), Options{Src: src, Dst: biasDst, Seed: 1, Bytes: bytes})
		if err == nil {
			err = rep.Err()
		}
		if err == nil {
			t.Fatalf("bytes %s: a changed zero-compute bias passed", bytes)
		}
		t.Logf("bytes %s: %v", bytes, firstLine(err.Error()))
	}
	editContract(t, dst, func(c map[string]any) { delete(c, "zero_experts") })
	// with the byte proof on, the edited config.json fails the manifest
	// first and the session's reason becomes a note; off, it is the error
	rep, err = Run(context.Background(), Options{Src: src, Dst: dst, Seed: 1, Bytes: BytesOff})
	if err == nil {
		err = rep.Err()
	}
	if err == nil || !strings.Contains(err.Error(), "zero_experts") {
		t.Fatalf("contract without zero_experts: %v", err)
	}
}
