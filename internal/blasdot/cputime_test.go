package blasdot

import (
	"math/rand/v2"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// threadCPU is the calling thread's CPU time (user and system): on a
// machine shared with other work, rates per CPU second say what a core
// does while it runs the code, where wall time also counts the waits.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	const rusageThread = 1 // RUSAGE_THREAD, Linux
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuRate runs f n times on one locked thread and returns flop per CPU
// second of that thread, in GFLOP/s.
func cpuRate(n int, flop float64, f func()) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f() // warm
	t0 := threadCPU()
	for range n {
		f()
	}
	return flop * float64(n) / (threadCPU() - t0).Seconds() / 1e9
}

// The products' rate per CPU second of one core at validate's shapes
// (BENCHMARKS.md compares it with the core's peak); a report, run with
// MOEPREP_CPURATE=1 go test -run CPURate -v ./internal/blasdot.
func TestCPURate(t *testing.T) {
	if os.Getenv("MOEPREP_CPURATE") == "" {
		t.Skip("a measurement: MOEPREP_CPURATE=1 runs it")
	}
	for _, sh := range benchShapes {
		a, w, c := values(newRand(), sh.m*sh.k, 1), values(newRand(), sh.n*sh.k, 1), make([]float32, sh.m*sh.n)
		x, out := make([][]float32, sh.m), make([][]float32, sh.m)
		for i := range x {
			x[i], out[i] = a[i*sh.k:(i+1)*sh.k], c[i*sh.n:(i+1)*sh.n]
		}
		flop := 2 * float64(sh.m*sh.n*sh.k)
		n := max(3, int(4e9/flop)) // about 4 GFLOP a product
		// As validate calls them: the tokens packed once for every band of
		// a weight (the rate of packing in each call as well beside it).
		tk := PackMatrix(sh.m, sh.k, a, sh.k)
		s := cpuRate(n, flop, func() { tk.SgemmNT(sh.n, w, sh.k, c, sh.n) })
		d := cpuRate(n, flop, func() { tk.Dot64Rows(w, sh.n, out) })
		tk.Release()
		sp := cpuRate(n, flop, func() { SgemmNT(sh.m, sh.n, sh.k, a, sh.k, w, sh.k, c, sh.n) })
		dp := cpuRate(n, flop, func() { Dot64Rows(x, w, sh.n, sh.k, out) })
		t.Logf("%s (assembly %v, AVX-512 %v): SgemmNT %.1f GFLOP/s, Dot64Rows %.1f GFLOP/s a CPU second (packing in each call: %.1f, %.1f)", sh.name, useAsm, useAVX512, s, d, sp, dp)
		if useAVX512 {
			// The same on the AVX2 kernel alone, beside it.
			var s2, d2 float64
			withAVX512(false, func() {
				tk := PackMatrix(sh.m, sh.k, a, sh.k)
				s2 = cpuRate(n, flop, func() { tk.SgemmNT(sh.n, w, sh.k, c, sh.n) })
				d2 = cpuRate(n, flop, func() { tk.Dot64Rows(w, sh.n, out) })
				tk.Release()
			})
			t.Logf("%s, the AVX2 kernel alone: SgemmNT %.1f, Dot64Rows %.1f GFLOP/s", sh.name, s2, d2)
		}
		if paddedTokens(sh.m)%blockTokens != 0 && crowdsL1(sh.k) {
			// The same, the block of eight taking two groups of rows at
			// once although they crowd an L1 set (what crowdsL1 avoids).
			save := crowdRows
			crowdRows = 2 * groupRows
			tk := PackMatrix(sh.m, sh.k, a, sh.k)
			s2 := cpuRate(n, flop, func() { tk.SgemmNT(sh.n, w, sh.k, c, sh.n) })
			d2 := cpuRate(n, flop, func() { tk.Dot64Rows(w, sh.n, out) })
			tk.Release()
			crowdRows = save
			t.Logf("%s, two groups at once: SgemmNT %.1f, Dot64Rows %.1f GFLOP/s", sh.name, s2, d2)
		}
	}
}

func newRand() *rand.Rand { return rand.New(rand.NewPCG(4, 4)) }
