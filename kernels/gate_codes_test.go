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
	scoringWord  = regexp.MustCompile(`\bscoring\b`)
	scoringTest  = regexp.MustCompile(`scoring\s*==\s*(\d+)(?:\s*\|\|\s*scoring\s*==\s*\d+)*`)
	scoringCode  = regexp.MustCompile(`scoring\s*==\s*(\d+)`)
	scoringOther = regexp.MustCompile(`\bint\s+scoring\b|\bscoring\s*[,)]`)
)

// TestGateScoringCodes reads kernels/cuda/*.cu and *.cuh and holds the
// scoring codes the gate kernels branch on to moe's (moe.Scoring.Code), so
// the integers exist once, in moe, and a scoring added there fails here
// until its kernels have its branch. The kernels' branches have this shape:
// the per-expert scorings share a branch `scoring == a || scoring == b`
// that scores each logit with sig_score, whose default is the sigmoid and
// which names every other per-expert scoring's code alone; the rest of the
// scorings have a branch each, naming their code alone, except softmax,
// the row branches' default. So, for each source: every comparison names
// codes of the scorings it implements; one names exactly the per-expert
// ones; each scoring but those two defaults is named alone; and nothing
// else reads the scoring. The defaults are why an unknown code would run
// as softmax (or sigmoid) on the device: GateSpec.Check and
// moe.Scoring.Code keep every code but these from being passed.
func TestGateScoringCodes(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("cuda", "*.cu"))
	if err != nil {
		t.Fatal(err)
	}
	headers, err := filepath.Glob(filepath.Join("cuda", "*.cuh"))
	if err != nil {
		t.Fatal(err)
	}
	srcs := gateSources()
	seen := map[string]bool{}
	for _, path := range append(paths, headers...) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text := cComment.ReplaceAllString(string(b), "")
		name := filepath.Base(path)
		implements, takes := srcs[name]
		if !takes {
			if scoringWord.MatchString(text) {
				t.Errorf("%s reads a scoring: add it to gateSources with the scorings it implements", name)
			}
			continue
		}
		seen[name] = true
		checkScoringBranches(t, name, text, implements)
	}
	for name := range srcs {
		if !seen[name] {
			t.Errorf("kernels/cuda/%s is missing", name)
		}
	}
}

func checkScoringBranches(t *testing.T, name, text string, implements []moe.Scoring) {
	t.Helper()
	byCode := map[int32]moe.Scoring{}
	var perExpert []int32
	for _, s := range implements {
		c, err := s.Code()
		if err != nil {
			t.Fatal(err)
		}
		if other, dup := byCode[c]; dup {
			t.Errorf("%s and %s share code %d", other, s, c)
		}
		byCode[c] = s
		if s.PerExpert() {
			perExpert = append(perExpert, c)
		}
	}
	slices.Sort(perExpert)
	// Every reading of the scoring is a comparison, a parameter or an argument.
	rest := scoringOther.ReplaceAllString(scoringTest.ReplaceAllString(text, ""), "")
	if loc := scoringWord.FindStringIndex(rest); loc != nil {
		t.Errorf("%s reads the scoring in a way this test does not know: %q", name, strings.TrimSpace(rest[max(0, loc[0]-30):min(len(rest), loc[1]+30)]))
	}
	alone := map[int32]bool{}
	perExpertBranch := false
	for _, cond := range scoringTest.FindAllString(text, -1) {
		var codes []int32
		for _, m := range scoringCode.FindAllStringSubmatch(cond, -1) {
			c, err := strconv.ParseInt(m[1], 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			switch s, ok := byCode[int32(c)]; {
			case !ok:
				t.Errorf("%s: %q names code %d, which is none of the scorings it implements (%v)", name, cond, c, implements)
			case s == moe.Softmax:
				t.Errorf("%s: %q names softmax's code %d, which must reach the default branch", name, cond, c)
			}
			codes = append(codes, int32(c))
		}
		slices.Sort(codes)
		switch {
		case slices.Equal(codes, perExpert):
			perExpertBranch = true
			if len(codes) == 1 {
				alone[codes[0]] = true
			}
		case len(codes) == 1:
			alone[codes[0]] = true
		default:
			t.Errorf("%s: %q names codes %v: neither one scoring nor the per-expert ones %v", name, cond, codes, perExpert)
		}
	}
	if !perExpertBranch {
		t.Errorf("%s has no branch naming exactly the per-expert scorings' codes %v", name, perExpert)
	}
	for c, s := range byCode {
		if s != moe.Sigmoid && s != moe.Softmax && !alone[c] {
			t.Errorf("%s has no branch of its own for %s scores (code %d): its kernels would run them as %s", name, s, c, map[bool]moe.Scoring{true: moe.Sigmoid, false: moe.Softmax}[s.PerExpert()])
		}
	}
}

// TestGateSourceConstants holds the gate sources' sizes to gate.go's.
func TestGateSourceConstants(t *testing.T) {
	for _, c := range []struct {
		file, name string
		want       int
	}{
		{"gate.cu", "GATE_MAX_EXPERTS", GateMaxExperts},
		{"gate_reg.cu", "GATE_MAX_EXPERTS", GateMaxExperts},
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
