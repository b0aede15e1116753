package kernels

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/moe"
)

// gateSources are the CUDA sources that take a scoring code, with the
// scorings each implements: gate.cu's kernels (GateBlock, GateWarp) those
// of gateBlockScorings, gate_reg.cu's (GateReg) every one moe defines.
func gateSources() map[string][]moe.Scoring {
	return map[string][]moe.Scoring{"gate.cu": gateBlockScorings, "gate_reg.cu": moe.Scorings()}
}

var (
	cComment     = regexp.MustCompile(`(?s)//[^\n]*|/\*.*?\*/`)
	cInclude     = regexp.MustCompile(`(?m)^\s*#\s*include\s+"([^"/]+\.cuh)"`)
	scoringConst = regexp.MustCompile(`\bconstexpr\s+int\s+(SCORING_\w+)\s*=\s*(\d+)\s*;`)
	scoringWord  = regexp.MustCompile(`\bscoring\b`)
	scoringTest  = regexp.MustCompile(`scoring\s*==\s*(\w+)(?:\s*\|\|\s*scoring\s*==\s*\w+)*`)
	scoringCode  = regexp.MustCompile(`scoring\s*==\s*(\w+)`)
	scoringOther = regexp.MustCompile(`\bint\s+scoring\b|\bscoring\s*[,)]`)
	trapDefault  = regexp.MustCompile(`\belse\s*\{\s*__trap\(\)\s*;`)
)

// scoringConstName is the name gate_common.cuh gives s's code.
func scoringConstName(s moe.Scoring) string { return "SCORING_" + strings.ToUpper(string(s)) }

// cudaSources reads kernels/cuda, comments removed: each .cu's own text
// (sources), the same followed by the text of the shared headers it
// includes, directly or through another header (units), and each header's
// text (headers).
func cudaSources(t *testing.T) (sources, units, headers map[string]string) {
	t.Helper()
	read := func(pattern string) map[string]string {
		paths, err := filepath.Glob(filepath.Join("cuda", pattern))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, path := range paths {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			m[filepath.Base(path)] = cComment.ReplaceAllString(string(b), "")
		}
		return m
	}
	headers, sources = read("*.cuh"), read("*.cu")
	units = map[string]string{}
	for name, text := range sources {
		seen := map[string]bool{}
		var add func(string) string
		add = func(text string) string {
			var b strings.Builder
			for _, m := range cInclude.FindAllStringSubmatch(text, -1) {
				h, ok := headers[m[1]]
				if !ok {
					t.Errorf("%s includes %s, which is not in kernels/cuda", name, m[1])
				}
				if ok && !seen[m[1]] {
					seen[m[1]] = true
					b.WriteString("\n" + add(h))
				}
			}
			return text + b.String()
		}
		units[name] = add(text)
	}
	return sources, units, headers
}

// TestGateScoringCodes holds the scoring codes of the gate kernels to
// moe's (moe.Scoring.Code), so each integer exists once in Go (moe) and
// once in CUDA (gate_common.cuh's SCORING_* constants, checked here
// against moe), and a scoring added to moe fails here until its kernels
// have its branch. It reads kernels/cuda: each .cu with the headers it
// includes. The kernels' branches have this shape: the per-expert scorings
// share a branch (gate_common.cuh's scoring_per_expert: `scoring == a ||
// scoring == b`) that scores each logit with sig_score, whose default is
// the sigmoid and which names every other per-expert scoring's constant
// alone; every other scoring has a branch naming its constant alone; and
// the row branches end in `else { __trap(); }`, so an unknown code stops
// the kernel instead of running as some scoring. So, for each source:
// every comparison names constants (no bare codes) of scorings it
// implements; one names exactly the per-expert ones; each scoring but the
// sigmoid is named alone; a default traps; and nothing else reads the
// scoring. GateSpec.Check and moe.Scoring.Code keep unknown codes from the
// launch in the first place.
func TestGateScoringCodes(t *testing.T) {
	sources, units, headers := cudaSources(t)
	consts := map[string]int32{}
	for name, text := range headers {
		for _, m := range scoringConst.FindAllStringSubmatch(text, -1) {
			if _, dup := consts[m[1]]; dup {
				t.Errorf("%s: %s defined twice", name, m[1])
			}
			c, err := strconv.ParseInt(m[2], 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			consts[m[1]] = int32(c)
		}
	}
	for name, text := range sources {
		if scoringConst.MatchString(text) {
			t.Errorf("%s defines a scoring code: they live in gate_common.cuh", name)
		}
	}
	named := map[string]bool{}
	for _, s := range moe.Scorings() {
		c, err := s.Code()
		if err != nil {
			t.Fatal(err)
		}
		n := scoringConstName(s)
		named[n] = true
		switch got, ok := consts[n]; {
		case !ok:
			t.Errorf("gate_common.cuh has no %s for moe's scoring %s (code %d)", n, s, c)
		case got != c:
			t.Errorf("gate_common.cuh: %s is %d, moe's code for %s is %d", n, got, s, c)
		}
	}
	for n := range consts {
		if !named[n] {
			t.Errorf("gate_common.cuh defines %s, which is none of moe's scorings %v", n, moe.Scorings())
		}
	}
	srcs := gateSources()
	for name, text := range units {
		implements, takes := srcs[name]
		if !takes {
			if scoringWord.MatchString(text) {
				t.Errorf("%s reads a scoring: add it to gateSources with the scorings it implements", name)
			}
			continue
		}
		checkScoringBranches(t, name, text, implements, consts)
	}
	for name := range srcs {
		if _, ok := units[name]; !ok {
			t.Errorf("kernels/cuda/%s is missing", name)
		}
	}
}

func checkScoringBranches(t *testing.T, name, text string, implements []moe.Scoring, consts map[string]int32) {
	t.Helper()
	byConst := map[string]moe.Scoring{}
	var perExpert []string
	for _, s := range implements {
		n := scoringConstName(s)
		byConst[n] = s
		if s.PerExpert() {
			perExpert = append(perExpert, n)
		}
	}
	slices.Sort(perExpert)
	// Every reading of the scoring is a comparison, a parameter or an argument.
	rest := scoringOther.ReplaceAllString(scoringTest.ReplaceAllString(text, ""), "")
	if loc := scoringWord.FindStringIndex(rest); loc != nil {
		t.Errorf("%s reads the scoring in a way this test does not know: %q", name, strings.TrimSpace(rest[max(0, loc[0]-30):min(len(rest), loc[1]+30)]))
	}
	alone := map[moe.Scoring]bool{}
	perExpertBranch := false
	for _, cond := range scoringTest.FindAllString(text, -1) {
		var names []string
		for _, m := range scoringCode.FindAllStringSubmatch(cond, -1) {
			n := m[1]
			_, known := consts[n]
			switch _, ok := byConst[n]; {
			case !known:
				t.Errorf("%s: %q compares the scoring with %s, not one of gate_common.cuh's SCORING_* constants", name, cond, n)
			case !ok:
				t.Errorf("%s: %q names %s, which is none of the scorings it implements (%v)", name, cond, n, implements)
			default:
				names = append(names, n)
			}
		}
		slices.Sort(names)
		switch {
		case len(names) == 0: // reported above
		case slices.Equal(names, perExpert):
			perExpertBranch = true
			if len(names) == 1 {
				alone[byConst[names[0]]] = true
			}
		case len(names) == 1:
			alone[byConst[names[0]]] = true
		default:
			t.Errorf("%s: %q names %v: neither one scoring nor the per-expert ones %v", name, cond, names, perExpert)
		}
	}
	if !perExpertBranch {
		t.Errorf("%s has no branch naming exactly the per-expert scorings %v", name, perExpert)
	}
	for _, s := range implements {
		if s != moe.Sigmoid && !alone[s] {
			t.Errorf("%s has no branch of its own for %s scores (%s)", name, s, scoringConstName(s))
		}
	}
	if !trapDefault.MatchString(text) {
		t.Errorf("%s has no `else { __trap(); }` default: an unknown scoring code would run as a known one", name)
	}
}

// TestGateSourceConstants holds the gate sources' sizes to gate.go's.
func TestGateSourceConstants(t *testing.T) {
	for _, c := range []struct {
		file, name string
		want       int
	}{
		{"gate_common.cuh", "GATE_MAX_EXPERTS", GateMaxExperts},
		{"gate.cu", "GATE_BLOCK_MAX_EXPERTS", GateBlockMaxExperts},
		{"gate.cu", "GATE_THREADS", gateThreads},
		{"gate.cu", "GATE_WARP_TOKENS", gateWarpTokens},
		{"gate_reg.cu", "GR_WARPS", gateWarpTokens},
	} {
		b, err := os.ReadFile(filepath.Join("cuda", c.file))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^#define\s+` + c.name + `\s+(\d+)\s*$`).FindSubmatch(b)
		if m == nil {
			t.Errorf("%s: no #define %s", c.file, c.name)
			continue
		}
		if got, _ := strconv.Atoi(string(m[1])); got != c.want {
			t.Errorf("%s: %s is %d, gate.go has %d", c.file, c.name, got, c.want)
		}
	}
}
