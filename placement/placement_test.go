package placement

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moeprep/moeprep/internal/testkit"
)

// A hand-checked case: expert 0 carries ten times the others' load; two
// redundant slots both go to it (shares 10 -> 5 -> 3.33), and the packing
// puts two of its replicas and expert 3 on rank 0 (7.67), one replica and
// experts 1, 2 on rank 1 (5.33): imbalance 0.179 against the contiguous
// ranges' 0.692.
func TestBalanceHandChecked(t *testing.T) {
	s := Spec{Experts: 4, Slots: 6, Ranks: 2, Nodes: 1, Groups: 1}
	load := []float64{10, 1, 1, 1}
	l := Layer{Map: balanceNode(load, allExperts(4), 6, 2)}
	if want := []int{0, 0, 3, 0, 1, 2}; !reflect.DeepEqual(l.Map, want) {
		t.Fatalf("map %v, want %v", l.Map, want)
	}
	got := RankLoads(s, l, load)
	if math.Abs(got[0]-23.0/3) > 1e-12 || math.Abs(got[1]-16.0/3) > 1e-12 {
		t.Errorf("rank loads %v, want [7.667 5.333]", got)
	}
	if imb := Imbalance(got); math.Abs(imb-(23.0/3-6.5)/6.5) > 1e-12 {
		t.Errorf("imbalance %v", imb)
	}
	// The contiguous map 0,1,2 | 3,0,1 happens to halve expert 0 onto
	// both ranks (6.5 each): Balance keeps it rather than the greedy one.
	if b, err := Balance(s, load); err != nil || !reflect.DeepEqual(b.Map, []int{0, 1, 2, 3, 0, 1}) {
		t.Errorf("Balance: %v %v, want the contiguous map", b.Map, err)
	}
}

// zipf is a skewed load: expert e's load falls as 1/(rank+1)^a over a
// random order of the experts, as recorded routing counts do.
func zipf(r *rand.Rand, e int, a float64) []float64 {
	perm := r.Perm(e)
	out := make([]float64, e)
	for i, p := range perm {
		out[p] = math.Floor(1e6 / math.Pow(float64(i+1), a))
	}
	return out
}

// Every placement holds every expert at least once, S/N slots a rank; a
// hierarchical one gives each node whole expert groups; on skewed loads
// it is no worse than the contiguous ranges, and with redundant slots
// well below them.
func TestBalanceProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name string
		s    Spec
		load func() []float64
		max  float64 // the computed imbalance must be at most this
	}{
		// Without replicas the hottest expert bounds the busiest rank (here
		// 3.3 times the mean rank's load by itself).
		{"DeepSeek-R1 EP32 no redundancy", Spec{256, 256, 32, 1, 1}, func() []float64 { return zipf(r, 256, 0.8) }, 2.3},
		{"DeepSeek-R1 EP36 288 slots", Spec{256, 288, 36, 1, 1}, func() []float64 { return zipf(r, 256, 0.8) }, 0.15},
		{"hierarchical 8 groups 4 nodes", Spec{256, 320, 32, 4, 8}, func() []float64 { return zipf(r, 256, 0.8) }, 0.25},
		{"Kimi-K2 384 experts EP64", Spec{384, 448, 64, 8, 1}, func() []float64 { return zipf(r, 384, 1.0) }, 0.3},
		{"ties: all equal", Spec{64, 64, 8, 1, 1}, func() []float64 { return slices64(64, 5) }, 0},
		{"one hot expert", Spec{16, 20, 4, 1, 1}, func() []float64 { l := slices64(16, 1); l[7] = 1000; return l }, 1.0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			load := tc.load()
			l, err := Balance(s, load)
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Map) != s.Slots {
				t.Fatalf("%d slots, want %d", len(l.Map), s.Slots)
			}
			seen := make([]int, s.Experts)
			for _, e := range l.Map {
				seen[e]++
			}
			for e, n := range seen {
				if n == 0 {
					t.Fatalf("expert %d has no slot", e)
				}
			}
			if s.Hierarchical() {
				per, slotsPerNode := s.Experts/s.Groups, s.Slots/s.Nodes
				nodeOfGroup := map[int]int{}
				for p, e := range l.Map {
					n := p / slotsPerNode
					if prev, ok := nodeOfGroup[e/per]; ok && prev != n {
						t.Fatalf("group %d on nodes %d and %d", e/per, prev, n)
					}
					nodeOfGroup[e/per] = n
				}
			}
			got := Imbalance(RankLoads(s, l, load))
			base := Imbalance(RankLoads(s, Contiguous(s), load))
			t.Logf("imbalance %.4f (contiguous %.4f)", got, base)
			if got > tc.max+1e-12 || got > base+1e-12 {
				t.Errorf("imbalance %.4f, want at most %.4f and the contiguous %.4f", got, tc.max, base)
			}
		})
	}
}

func slices64(n int, v float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestSpecRefusals(t *testing.T) {
	for _, tc := range []struct {
		s    Spec
		want string
	}{
		{Spec{256, 250, 8, 1, 1}, "250 slots cannot hold 256 experts"},
		{Spec{256, 280, 32, 1, 1}, "280 slots do not divide among 32 ranks"},
		{Spec{256, 256, 32, 3, 1}, "32 ranks do not divide among 3 nodes"},
		{Spec{256, 256, 32, 1, 7}, "256 experts do not divide into 7 groups"},
	} {
		if err := tc.s.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.s, err, tc.want)
		}
	}
}

// 61 layers × 384 experts on 64 ranks (448 slots) in well under a second.
func TestPlaceSpeed(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	st := &Stats{File: "x"}
	for l := range 61 {
		st.Layers = append(st.Layers, l)
		st.Loads = append(st.Loads, zipf(r, 384, 0.9))
	}
	start := time.Now()
	res, err := Place(Spec{Slots: 448, Ranks: 64, Nodes: 8, Groups: 8}, st)
	if err != nil {
		t.Fatal(err)
	}
	d := time.Since(start)
	t.Logf("61 layers x 384 experts, 448 slots on 64 ranks: %v; mean imbalance %.3f (contiguous %.3f)", d, res.MeanImbalanceComputed, res.MeanImbalanceContiguous)
	if d > time.Second {
		t.Errorf("took %v", d)
	}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "stats.json")
	testkit.WriteFile(t, p, []byte(body))
	return p
}

func TestReadStats(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		layers     []int
		loads      [][]float64
		err        string
	}{
		{"sglang 2d", `{"logical_count": [[1, 2], [3, 4]]}`, []int{0, 1}, [][]float64{{1, 2}, {3, 4}}, ""},
		{"sglang 3d summed", `{"logical_count": [[[1, 2], [3, 4]], [[10, 20], [30, 40]]]}`, []int{0, 1}, [][]float64{{11, 22}, {33, 44}}, ""},
		{"plain", `{"5": [1, 0], "3": [2, 2]}`, []int{3, 5}, [][]float64{{2, 2}, {1, 0}}, ""},
		{"negative", `{"3": [1, -2]}`, nil, nil, "layer 3, expert 1: count -2 is not a number of tokens"},
		{"absurd", `{"3": [1, 1e400]}`, nil, nil, "layer 3, expert 1: count 1e400 is not a number of tokens"},
		{"string", `{"3": [1, "x"]}`, nil, nil, "layer 3: want a list of counts"},
		{"ragged", `{"logical_count": [[1, 2], [3]]}`, nil, nil, "layer 1 has 1 experts, layer 0 has 2"},
		{"bad key", `{"mlp": [1]}`, nil, nil, `key "mlp" is not a layer index`},
		{"empty", `{}`, nil, nil, "no layer recorded"},
		{"snapshots differ", `{"logical_count": [[[1, 2]], [[1, 2], [3, 4]]]}`, nil, nil, "snapshot 1 has 2 layers, snapshot 0 has 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, tc.body)
			checkStats(t, p, tc.layers, tc.loads, tc.err)
		})
	}
}

// The files written for SGLang and TensorRT-LLM read back to the maps.
func TestWriters(t *testing.T) {
	st := &Stats{File: "x", Layers: []int{1, 3}, Loads: [][]float64{{9, 1, 1, 1}, {1, 1, 1, 9}}}
	res, err := Place(Spec{Slots: 6, Ranks: 2, Nodes: 1, Groups: 1}, st)
	if err != nil {
		t.Fatal(err)
	}
	var sg bytes.Buffer
	if err := res.WriteSGLang(&sg); err != nil {
		t.Fatal(err)
	}
	var back struct {
		P2L [][]int `json:"physical_to_logical_map"`
	}
	if err := json.Unmarshal(sg.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	contiguous := []int{0, 1, 2, 3, 0, 1}
	want := [][]int{contiguous, res.PhysicalToLogical[0], contiguous, res.PhysicalToLogical[1]}
	if !reflect.DeepEqual(back.P2L, want) {
		t.Errorf("sglang map %v, want %v", back.P2L, want)
	}
	var tr bytes.Buffer
	if err := res.WriteTRTLLM(&tr); err != nil {
		t.Fatal(err)
	}
	y := tr.String()
	if !strings.HasPrefix(y, "num_slots: 6\ninitial_global_assignments:\n") {
		t.Fatalf("yaml:\n%s", y)
	}
	row := regexp.MustCompile(`(?m)^  (\d+): \[([0-9, ]*)\]$`)
	got := map[int][]int{}
	for _, m := range row.FindAllStringSubmatch(y, -1) {
		l, _ := strconv.Atoi(m[1])
		for _, f := range strings.Split(m[2], ", ") {
			e, _ := strconv.Atoi(f)
			got[l] = append(got[l], e)
		}
	}
	if !reflect.DeepEqual(got, map[int][]int{1: res.PhysicalToLogical[0], 3: res.PhysicalToLogical[1]}) {
		t.Errorf("yaml assignments %v", got)
	}
	// Layer 1's hot expert 0 suits the contiguous map (its wrapped
	// replica halves it): kept. Layer 3's hot expert 3 does not.
	if !reflect.DeepEqual(res.PhysicalToLogical[0], contiguous) || res.ImbalanceComputed[1] >= res.ImbalanceContiguous[1] {
		t.Errorf("maps %v, imbalance %v vs contiguous %v", res.PhysicalToLogical, res.ImbalanceComputed, res.ImbalanceContiguous)
	}
}

// checkStats reads path with ReadStats and wants its layers and loads, or,
// with wantErr set, an error naming path and saying wantErr.
func checkStats(t *testing.T, path string, layers []int, loads [][]float64, wantErr string) {
	t.Helper()
	st, err := ReadStats(path)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) || !strings.Contains(err.Error(), path) {
			t.Fatalf("got %v, want an error naming %s and saying %q", err, path, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st.Layers, layers) || !reflect.DeepEqual(st.Loads, loads) {
		t.Errorf("got %v %v, want %v %v", st.Layers, st.Loads, layers, loads)
	}
}
