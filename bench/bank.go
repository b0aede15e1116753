package bench

import (
	"fmt"

	"github.com/moeprep/moeprep/internal/cuda"
	"github.com/moeprep/moeprep/kernels"
)

// stageBytes is the random tile uploaded once and copied across the banks:
// 64 MiB, not a divisor of an expert's size, so no two experts hold the
// same values at the same offsets.
const stageBytes = 64 << 20

// bankAlloc tracks a bank's buffers so they can be freed.
type bankAlloc struct {
	bank *kernels.ExpertBank
	free []func() error
}

func (b *bankAlloc) Free() {
	for _, f := range b.free {
		f()
	}
	b.free = nil
}

// newBank allocates one fused-layout expert bank ([E,2I,H] gate rows first,
// [E,H,I] down) of dtype d for shape s. Its weights are filled by fillBank
// or copyBank; fp8 scales are random here.
func newBank(dev *cuda.Device, s Shape, d DType, seed uint64) (*bankAlloc, error) {
	e, h, in := s.BankExperts(), s.H, s.I
	b := &bankAlloc{bank: &kernels.ExpertBank{NumExperts: e, H: h, I: in, DType: d.Mat()}}
	var err error
	weights := func(n int) kernels.Mat {
		if err != nil {
			return kernels.Mat{}
		}
		if d == FP8 {
			var buf *cuda.Buffer[uint8]
			if buf, err = cuda.Alloc[uint8](dev, n); err != nil {
				return kernels.Mat{}
			}
			b.free = append(b.free, buf.Free)
			return kernels.FP8Mat(buf)
		}
		var buf *cuda.Buffer[uint16]
		if buf, err = cuda.Alloc[uint16](dev, n); err != nil {
			return kernels.Mat{}
		}
		b.free = append(b.free, buf.Free)
		return kernels.BF16Mat(buf)
	}
	scales := func(n int, seed uint64) *cuda.Buffer[float32] {
		if err != nil {
			return nil
		}
		v := make([]float32, n)
		r := rng{seed}
		for i := range v {
			v[i] = (1 + r.uniform(0.5)) / 256 // 2^-8 +- 50%: weights ~0.01
		}
		var buf *cuda.Buffer[float32]
		if buf, err = cuda.FromHost(dev, v); err != nil {
			return nil
		}
		b.free = append(b.free, buf.Free)
		return buf
	}
	b.bank.GateUp = weights(e * 2 * in * h)
	b.bank.Down = weights(e * h * in)
	if d == FP8 {
		b.bank.GateUpScale = scales(e*2*int(scaleGrid(in, h)), seed)
		b.bank.DownScale = scales(e*int(scaleGrid(h, in)), seed+1)
	}
	if err != nil {
		b.Free()
		return nil, fmt.Errorf("bench: allocating a %s expert bank of %d experts (%.1f GB): %w", d, e, float64(s.BankBytes(d))/1e9, err)
	}
	return b, nil
}

// fillBank fills the bank's weights by tiling one random 64 MiB stage
// (generated on the host, uploaded once) with device-to-device copies.
func fillBank(dev *cuda.Device, b *bankAlloc, d DType, seed uint64) error {
	host := make([]byte, stageBytes)
	if d == FP8 {
		RandFP8(host, seed)
	} else {
		u := make([]uint16, stageBytes/2)
		RandBF16(u, seed, 0.035) // uniform, std 0.02
		for i, v := range u {
			host[2*i], host[2*i+1] = byte(v), byte(v>>8)
		}
	}
	stage, err := cuda.FromHost(dev, host)
	if err != nil {
		return fmt.Errorf("bench: weight stage: %w", err)
	}
	defer stage.Free()
	return dev.Do(func(c *cuda.Ctx) error {
		for _, m := range []kernels.Mat{b.bank.GateUp, b.bank.Down} {
			total := int64(m.Len) * d.WeightBytes()
			for off := int64(0); off < total; off += stageBytes {
				n := min(stageBytes, total-off)
				if err := c.CopyDtoD(m.Ptr.Add(int(off)), stage.Ptr(), int(n)); err != nil {
					return fmt.Errorf("bench: filling the expert bank: %w", err)
				}
			}
		}
		return c.Synchronize()
	})
}

// copyBank copies src's weights into dst (same shape and dtype).
func copyBank(dev *cuda.Device, dst, src *bankAlloc, d DType) error {
	return dev.Do(func(c *cuda.Ctx) error {
		pairs := [][2]kernels.Mat{{dst.bank.GateUp, src.bank.GateUp}, {dst.bank.Down, src.bank.Down}}
		for _, p := range pairs {
			if err := c.CopyDtoD(p[0].Ptr, p[1].Ptr, int(int64(p[1].Len)*d.WeightBytes())); err != nil {
				return fmt.Errorf("bench: copying the expert bank: %w", err)
			}
		}
		return c.Synchronize()
	})
}

// workingBytes is the device memory one token count needs besides the
// banks: xsets input sets (x, logits, gate outputs, alignment) and the
// shared intermediate, expert output and layer output.
func workingBytes(s Shape, t, blockSize, xsets int, w8a8 bool) int64 {
	T, H, I, E, K := int64(t), int64(s.H), int64(s.I), int64(s.Routed), int64(s.Slots())
	EB, bs := int64(s.BankExperts()), int64(blockSize)
	maxPad := T*K + EB*(bs-1)
	align := maxPad*4 + (maxPad/bs+1)*4 + (T*K/256+1)*EB*4 + EB*8 + 16
	set := T*H*2 + T*E*4 + T*K*8 + align
	quant := int64(0)
	if w8a8 {
		quant = kernels.QuantScratchBytes(t, s.Slots(), s.H, s.I)
	}
	return int64(xsets)*set + T*K*I*2 + T*K*H*4 + T*H*4 + quant
}

// bankCopies decides how many bank copies to rotate: the requested number,
// or as many as free memory holds beside reserve, at most maxBankCopies.
func bankCopies(requested int, free, reserve, bank int64) (int, error) {
	fit := int64(0)
	if free > reserve {
		fit = (free - reserve) / bank
	}
	if requested > 0 {
		if int64(requested) > fit {
			return 0, fmt.Errorf("bench: %d bank copies of %.1f GB do not fit in %.1f GB free (%.1f GB kept for buffers)",
				requested, float64(bank)/1e9, float64(free)/1e9, float64(reserve)/1e9)
		}
		return requested, nil
	}
	if fit < 1 {
		return 0, fmt.Errorf("bench: one expert bank of %.1f GB does not fit in %.1f GB free (%.1f GB kept for buffers)",
			float64(bank)/1e9, float64(free)/1e9, float64(reserve)/1e9)
	}
	return int(min(fit, maxBankCopies)), nil
}
