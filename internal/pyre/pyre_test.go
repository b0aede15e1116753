package pyre

import (
	"bufio"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/testkit"
)

// unescape undoes make_cases.py's escaping of tabs, newlines and backslashes.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
			switch s[i] {
			case 't':
				b.WriteByte('\t')
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte(s[i])
			}
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// TestAgainstPython checks every pattern × name of testdata/python_re.tsv
// (written by Python 3.11's re.match and fnmatch.fnmatchcase with
// make_cases.py) gives Python's answer: a match, no match, or a pattern
// Python refuses.
func TestAgainstPython(t *testing.T) {
	f := testkit.Open(t, "testdata/python_re.tsv")
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) != 4 {
			t.Fatalf("line %d: %d fields", n+1, len(fields))
		}
		kind, pat, name, want := fields[0], unescape(fields[1]), unescape(fields[2]), fields[3]
		n++
		var got string
		switch kind {
		case "re":
			re, err := Parse(pat)
			if err != nil {
				got = "error"
				break
			}
			ok, _, err := re.Match(name, 1_000_000)
			if err != nil {
				t.Errorf("re.match(%q, %q): %v", pat, name, err)
				continue
			}
			got = map[bool]string{true: "1", false: "0"}[ok]
		case "glob":
			g, err := ParseGlob(pat)
			if err != nil {
				t.Fatalf("glob %q: %v", pat, err)
			}
			got = map[bool]string{true: "1", false: "0"}[g.Match(name)]
		}
		if got != want {
			t.Errorf("%s %q on %q: got %s, Python says %s", kind, pat, name, got, want)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 1500 {
		t.Fatalf("read %d cases, want the whole table", n)
	}
}

// TestBudget: patterns Python backtracks on for ever are an error here,
// quickly, and the step count is what was allowed.
func TestBudget(t *testing.T) {
	for _, tc := range []struct {
		pat, in string
		limit   int64
	}{
		{`(x+x+)+y`, strings.Repeat("x", 60) + "zy", 100_000},
		{`(?:x|x)*y`, strings.Repeat("x", 60) + "zy", 100_000},
		{`.*a.*a.*a.*a.*a.*[bd]$`, strings.Repeat("a", 200) + "bc", 50_000},
		// a megabyte-long name: iterations nest past maxDepth long before
		// the budget, and are refused rather than grow the stack
		{`(?:ab)*c`, strings.Repeat("ab", 1<<19) + "c", 1 << 30},
	} {
		re, err := Parse(tc.pat)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, used, err := re.Match(tc.in, tc.limit)
		var be *BudgetError
		if !errors.As(err, &be) {
			t.Fatalf("%q: got %v, want a budget error", tc.pat, err)
		}
		if (used != tc.limit+1 && tc.limit < 1<<30) || be.Steps != tc.limit {
			t.Errorf("%q: used %d steps, error says %d; allowed %d", tc.pat, used, be.Steps, tc.limit)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%q: %v to spend %d steps", tc.pat, d, tc.limit)
		}
	}
}

// TestCheapWhereRE2IsCostly: the 1 KB pattern that made RE2 compile
// 145,000 instructions (1.2 GB, ~10 s) parses to a tree the size of its
// text and fails a module name in a handful of steps; an empty group
// repeated a billion times is one step, not a billion (Python itself
// takes gigabytes on it).
func TestCheapWhereRE2IsCostly(t *testing.T) {
	for _, tc := range []struct {
		pat      string
		in       string
		want     bool
		maxSteps int64
	}{
		{strings.Repeat(".{1000}", 145) + "NNN", "model.layers.3.mlp.experts.0.gate_proj", false, 1},
		{strings.Repeat(".{1000}", 145) + "mlp", "model.layers.3.mlp.experts.0.gate_proj", false, 200},
		{`(?:){1000000000}`, "x", true, 10},
		{`(?:.{1000}){1000}`, "model.layers.1", false, 200},
	} {
		re, err := Parse(tc.pat)
		if err != nil {
			t.Fatal(err)
		}
		ok, used, err := re.Match(tc.in, 1_000_000)
		if err != nil || ok != tc.want || used > tc.maxSteps {
			t.Errorf("%.40q on %q: %v, %d steps, %v; want %v in at most %d steps", tc.pat, tc.in, ok, used, err, tc.want, tc.maxSteps)
		}
	}
}

// TestRefusals: what Python accepts but pyre does not read says so.
func TestRefusals(t *testing.T) {
	for _, tc := range []struct{ pat, want string }{
		{`(a)\1`, "backreferences are not read"},
		{`(?P<x>a)(?P=x)`, "backreferences are not read"},
		{`(?(1)a|b)`, "conditional groups are not read"},
		{`\N{DIGIT ONE}`, "named Unicode escapes"},
		{strings.Repeat("(", 65) + strings.Repeat(")", 65), "nested over 64 deep"},
		{strings.Repeat("a", MaxPatternLen+1), "over the limit"},
		{`.*(?<=a+)b`, "look-behind requires fixed-width pattern"},
	} {
		_, err := Parse(tc.pat)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.30q: got %v, want an error saying %q", tc.pat, err, tc.want)
		}
	}
}

func FuzzParseMatch(f *testing.F) {
	for _, s := range []string{`.*self_attn.*`, `.*mlp\.(?!experts)(gate|up|down)_proj.*`, `(?i)a{2,3}?b+`,
		`.*(?<=mlp\.)gate$`, `(?>x*)x`, `[^]a-z\d]`, `(?x) a # c`, `(?:){99}`, `\x41\u0042`} {
		f.Add(s, "model.layers.3.mlp.experts.17.gate_proj")
	}
	f.Fuzz(func(t *testing.T, pat, in string) {
		re, err := Parse(pat)
		if err != nil {
			return
		}
		_, used, err := re.Match(in, 10_000)
		if err == nil && used > 10_000 {
			t.Fatalf("%q on %q: %d steps past the limit without an error", pat, in, used)
		}
		g, _ := ParseGlob(pat)
		if g != nil {
			g.Match(in)
		}
	})
}
