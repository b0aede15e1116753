package validate

import (
	"os"
	"path/filepath"
	"testing"
)

// --jobs is bounded by the cores and by what memory holds at one expert's
// decoded weights a job, never below one job (issue 41: --jobs 100000 ran
// every expert of a layer at once, at twice the default's RSS).
func TestCapJobs(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		name           string
		requested      int
		cores          int
		perJob, budget int64
		want           int
		why            string
	}{
		{"default fits", 2, 2, 50 * mb, 20000 * mb, 2, ""},
		{"issue 41: 100000 on 2 cores", 100000, 2, 50 * mb, 20000 * mb, 2, cappedByCores},
		{"fewer than the cores", 3, 16, 50 * mb, 20000 * mb, 3, ""},
		{"memory below the cores", 16, 16, 352 * mb, 1500 * mb, 4, cappedByMemory},
		{"memory below a small request", 4, 64, 352 * mb, 800 * mb, 2, cappedByMemory},
		{"exactly fits", 4, 8, 100 * mb, 400 * mb, 4, ""},
		{"one byte short", 4, 8, 100 * mb, 400*mb - 1, 3, cappedByMemory},
		{"no room still runs one", 8, 8, 352 * mb, 100 * mb, 1, cappedByMemory},
		{"less than nothing still runs one", 8, 8, 352 * mb, -500 * mb, 1, cappedByMemory},
		{"one asked, none capped", 1, 8, 352 * mb, -500 * mb, 1, ""},
		{"memory unknown: cores alone", 100000, 4, 50 * mb, noMemoryLimit, 4, cappedByCores},
		{"cost unknown: cores alone", 100000, 4, 0, 10 * mb, 4, cappedByCores},
		{"cores unknown: memory alone", 100000, 0, 50 * mb, 500 * mb, 10, cappedByMemory},
		{"zero asked is one", 0, 4, 50 * mb, 500 * mb, 1, ""},
	} {
		got, why := capJobs(tc.requested, tc.cores, tc.perJob, tc.budget)
		if got != tc.want || why != tc.why {
			t.Errorf("%s: capJobs(%d, %d cores, %d per job, budget %d) = %d (%q), want %d (%q)",
				tc.name, tc.requested, tc.cores, tc.perJob, tc.budget, got, why, tc.want, tc.why)
		}
	}
}

// MemAvailable is read in bytes from meminfo's kB; anything else is no
// figure at all.
func TestMeminfoAvailable(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		text string
		want int64
		ok   bool
	}{
		{"MemTotal:       24573004 kB\nMemFree:        23000000 kB\nMemAvailable:   24273496 kB\n", 24273496 * 1024, true},
		{"MemTotal:       24573004 kB\n", 0, false},
		{"MemAvailable:   lots kB\n", 0, false},
		{"MemAvailable:   99999999999999999 kB\n", 0, false}, // past int64 in bytes
	} {
		p := filepath.Join(dir, "meminfo")
		if err := os.WriteFile(p, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		got, ok := meminfoAvailable(p)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.text, got, ok, tc.want, tc.ok)
		}
	}
}
