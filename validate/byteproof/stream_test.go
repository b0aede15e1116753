package byteproof

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/layout"
)

// A block digest taken over pieces that come in any order, each block's
// bytes held until their turn, is the digest of the file read in order;
// a byte that comes twice, or one that never comes, leaves it unknown.
func TestBlockHashAnyOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	data := make([]byte, 100_003)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, like := range []layout.FileInfo{
		{X3Blocks: layout.BlockDigest{BlockSize: 4096}},
		{B3Blocks: layout.BlockDigest{BlockSize: 777}},
		{Blocks: layout.BlockDigest{BlockSize: 100_003}},
	} {
		want, err := layout.HashFileLike(path, like)
		if err != nil {
			t.Fatal(err)
		}
		// pieces of random sizes, in a random order
		var cuts [][2]int
		for at := 0; at < len(data); {
			n := min(len(data)-at, 1+r.IntN(9000))
			cuts = append(cuts, [2]int{at, at + n})
			at += n
		}
		r.Shuffle(len(cuts), func(i, j int) { cuts[i], cuts[j] = cuts[j], cuts[i] })
		// held whole, then mostly read again from the file (a few
		// kilobytes held), then read again whole
		for _, maxEarly := range []int64{maxEarlyBytes, 20_000, 0} {
			bh, err := newBlockHash(like, int64(len(data)), path, &earlyBudget{max: maxEarly})
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range cuts {
				if i == len(cuts)-1 {
					if _, ok := bh.sum(); ok {
						t.Fatalf("a sum before the last piece")
					}
				}
				bh.write(int64(c[0]), data[c[0]:c[1]])
				if bh.held > maxEarly {
					t.Fatalf("maxEarly %d: %d bytes held", maxEarly, bh.held)
				}
			}
			if got, ok := bh.sum(); !ok || got != want {
				t.Errorf("%v maxEarly %d: got %v (%v), want %v", like, maxEarly, got, ok, want)
			}
			if bh.held != 0 {
				t.Errorf("%v maxEarly %d: %d bytes still held", like, maxEarly, bh.held)
			}
			bh.write(int64(cuts[0][0]), data[cuts[0][0]:cuts[0][1]])
			if _, ok := bh.sum(); ok {
				t.Errorf("%v maxEarly %d: bytes hashed twice still sum", like, maxEarly)
			}
		}
	}
	// Pieces held nowhere whose file is gone leave the sum unknown.
	gone := filepath.Join(t.TempDir(), "gone")
	bh, err := newBlockHash(layout.FileInfo{X3Blocks: layout.BlockDigest{BlockSize: 4096}}, 8192, gone, &earlyBudget{max: 0})
	if err != nil {
		t.Fatal(err)
	}
	bh.write(4096, data[4096:8192])
	bh.write(100, data[100:4096])
	bh.write(0, data[:100])
	if _, ok := bh.sum(); ok {
		t.Errorf("a piece that could not be read again still sums")
	}
	if bh, err := newBlockHash(layout.FileInfo{SHA256: "x"}, 10, path, &earlyBudget{max: maxEarlyBytes}); bh != nil || err != nil {
		t.Errorf("a whole-file SHA-256 needs its bytes in order: %v %v", bh, err)
	}
}

// The early pieces of every shard's block hash share one budget: the
// shards of a model that each hold a block's early pieces (a layer's
// stacks before its attention) hold no more than it together, and each
// still sums to its file's digest, its other pieces read again.
func TestBlockHashesShareTheirBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const files, size, bs = 4, 3 * 4096, 4096
	like := layout.FileInfo{X3Blocks: layout.BlockDigest{BlockSize: bs}}
	budget := &earlyBudget{max: 5000}
	var hashes []*blockHash
	var datas [][]byte
	var wants []layout.FileInfo
	for range files {
		data := make([]byte, size)
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		path := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		want, err := layout.HashFileLike(path, like)
		if err != nil {
			t.Fatal(err)
		}
		bh, err := newBlockHash(like, size, path, budget)
		if err != nil {
			t.Fatal(err)
		}
		hashes, datas, wants = append(hashes, bh), append(datas, data), append(wants, want)
	}
	// Every file's second half of each block first: 2 KiB early a block,
	// 6 KiB a file, 24 KiB in all against a budget of 5000 bytes.
	for i, bh := range hashes {
		for k := 0; k < size; k += bs {
			bh.write(int64(k+bs/2), datas[i][k+bs/2:k+bs])
			if budget.held > budget.max {
				t.Fatalf("%d bytes held, budget %d", budget.held, budget.max)
			}
		}
	}
	var held int64
	for _, bh := range hashes {
		held += bh.held
	}
	if held != budget.held || held == 0 {
		t.Errorf("the hashes hold %d bytes, the budget says %d", held, budget.held)
	}
	for i, bh := range hashes {
		for k := 0; k < size; k += bs {
			bh.write(int64(k), datas[i][k:k+bs/2])
		}
		if got, ok := bh.sum(); !ok || got != wants[i] {
			t.Errorf("file %d: got %v (%v), want %v", i, got, ok, wants[i])
		}
	}
	if budget.held != 0 {
		t.Errorf("%d bytes still held", budget.held)
	}
}
