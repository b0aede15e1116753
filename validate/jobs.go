package validate

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/moeprep/moeprep/internal/cores"
	"github.com/moeprep/moeprep/internal/human"
	"github.com/moeprep/moeprep/moe"
	"github.com/moeprep/moeprep/validate/stream"
)

// How many experts a run computes at once (Options.Workers, --jobs) is
// bounded by what memory holds, not by the count asked for alone: each job
// holds an expert's weights decoded to float32, so `--jobs 100000` used to
// run every expert of a layer at once and peak at twice the default's RSS
// (issue 41). The memory model is README's: a run holds about
// B + 2 (W+1) D + 30 MB, B the pass's read-ahead budget, D one expert's
// weights as float32 (3·H·I·4 bytes), W the jobs, 2 the collector's headroom.
// Since issue 45 a job decodes its expert a band of rows at a time and
// holds its stored bytes instead (SRC's and DST's: D at two bytes a
// weight, half of it at one), so D still bounds a job from above.

// jobsBase is the model's fixed 30 MB: the runtime, the plans, the tokens.
const jobsBase = 30 << 20

// noMemoryLimit is the budget when nothing says how much memory is left.
const noMemoryLimit = math.MaxInt64

// Why capJobs ran fewer jobs than asked.
const (
	cappedByCores  = "cores"
	cappedByMemory = "memory"
)

// capJobs is how many jobs run for requested (at least 1): at most cores
// (a job past them only waits for a core, holding its expert all the
// while), and at most what budget bytes hold at perJob bytes a job, but
// never fewer than one (a run that cannot hold one job still runs one:
// refusing would stop a run the default always made). why says which bound
// took jobs below requested ("" when none did).
func capJobs(requested, cores int, perJob, budget int64) (jobs int, why string) {
	jobs = max(requested, 1)
	if cores >= 1 && jobs > cores {
		jobs, why = cores, cappedByCores
	}
	if perJob > 0 {
		if fit := max(budget/perJob, 1); int64(jobs) > fit {
			jobs, why = int(fit), cappedByMemory
		}
	}
	return jobs, why
}

// capJobs sets s.o.Workers to the jobs the run computes at once for
// targets and returns the report's note when that is fewer than asked (the
// default: one per core, up to 4; "" when nothing capped it).
func (s *session) capJobs(targets []target) string {
	requested, asked := s.o.Workers, fmt.Sprintf("--jobs %d", s.o.Workers)
	if requested <= 0 {
		requested = moe.Workers()
		asked = fmt.Sprintf("the default %d jobs", requested)
	}
	d := s.expertF32Bytes(targets)
	perJob := 2 * d
	// The rest of the model: the pass's budget (four steps of at most D
	// each: SRC's and DST's bytes of an expert, at two bytes a weight or
	// fewer, within stream's bounds), the one job more the model counts
	// (the shared expert's) and the base.
	fixed := min(max(4*d, stream.MinBudget), stream.MaxBudget) + 2*d + jobsBase
	budget := int64(noMemoryLimit)
	avail := memoryAvailable()
	if avail < noMemoryLimit {
		budget = avail - fixed
	}
	jobs, why := capJobs(requested, cores.N(), perJob, budget)
	s.o.Workers = jobs
	switch why {
	case cappedByCores:
		return fmt.Sprintf("%s capped at %s at once: one per core (%s); more would only wait for a core, each holding an expert's weights", asked, human.Count(jobs, "expert"), human.Count(cores.N(), "core"))
	case cappedByMemory:
		return fmt.Sprintf("%s capped at %s at once: what memory holds (each job about %s, an expert's weights as float32 with the collector's headroom; %s available, %s of it for the pass's read-ahead and the rest of the run)",
			asked, human.Count(jobs, "expert"), human.Bytes(perJob), human.Bytes(avail), human.Bytes(fixed))
	}
	return ""
}

// expertF32Bytes is D: the largest expert of targets decoded to float32,
// its gate, up and down projections (0 when no target says).
func (s *session) expertF32Bytes(targets []target) int64 {
	var d int64
	for _, tg := range targets {
		h, inter := 0, 0
		switch {
		case tg.src != nil && s.srcPlan != nil:
			h, inter = s.srcPlan.HiddenSize, s.srcPlan.IntermediateOf(*tg.src)
		case tg.fused != nil && s.dst != nil:
			var err error
			if h, inter, err = tg.fused.StackDims(s.dst); err != nil {
				continue // the layer's own check reports it
			}
		}
		d = max(d, 3*int64(h)*int64(inter)*4)
	}
	return d
}

// memoryAvailable is the memory this run may still take: the least of the
// kernel's MemAvailable, the cgroup's limit less its usage (v2, then v1),
// and the Go runtime's limit (GOMEMLIMIT); noMemoryLimit when none says.
func memoryAvailable() int64 {
	avail := int64(noMemoryLimit)
	if v, ok := meminfoAvailable("/proc/meminfo"); ok {
		avail = min(avail, v)
	}
	for _, cg := range [][2]string{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
	} {
		limit, ok1 := readInt(cg[0])
		usage, ok2 := readInt(cg[1])
		if ok1 && ok2 {
			avail = min(avail, max(limit-usage, 0))
			break
		}
	}
	if l := debug.SetMemoryLimit(-1); l > 0 {
		avail = min(avail, l)
	}
	return avail
}

// meminfoAvailable reads MemAvailable (kB) from a /proc/meminfo file.
func meminfoAvailable(path string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil || kb < 0 || kb > math.MaxInt64/1024 {
				return 0, false
			}
			return kb * 1024, true
		}
	}
	return 0, false
}

// readInt reads a cgroup file holding one number ("max", no limit: false).
func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil && v >= 0
}
