package torchbin

import (
	"archive/zip"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	pk "github.com/moeprep/moeprep/internal/testkit/pickle"
)

// seedFiles lists every checkpoint under testdata, good and broken.
func seedFiles(f *testing.F) []string {
	var paths []string
	err := filepath.Walk("testdata", func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() && (strings.HasSuffix(p, ".bin") || strings.HasSuffix(p, ".pt")) {
			paths = append(paths, p)
		}
		return err
	})
	if err != nil || len(paths) == 0 {
		f.Fatalf("no seed files: %v", err)
	}
	return paths
}

// FuzzUnpickle feeds arbitrary bytes as data.pkl, with every storage key
// resolving to a fake entry. It runs without parseGuarded's recover, so any
// crash in gopickle that scanPickle lets through is reported, and it bounds
// each input's time and allocation. Seeds: the data.pkl of every testdata
// archive, the hand-written pickles and a small torch-style MoE shard.
func FuzzUnpickle(f *testing.F) {
	for _, p := range seedFiles(f) {
		zr, err := zip.OpenReader(p)
		if err != nil {
			continue // legacy and not-torch files: no data.pkl
		}
		for _, zf := range zr.File {
			if strings.HasSuffix(zf.Name, "/data.pkl") {
				if rc, err := zf.Open(); err == nil {
					b, _ := io.ReadAll(rc)
					rc.Close()
					f.Add(b)
				}
			}
		}
		zr.Close()
	}
	f.Add(pk.Of(pk.Dict(pk.Str("w"), v3call(pid("torch.storage", "UntypedStorage", "0", 64), 0, []int{2, 3}, []int{1, 2}, "float8_e4m3fn"))))
	f.Add(pk.Of(pk.Dict(pk.Str("model"), pk.Dict(pk.Str("w"), v2call(pid("torch", "FloatStorage", "0", 16), 0, []int{4}, []int{1})))))
	f.Add(torchStateDict(3))
	storage := make([]byte, 64)
	for i := range storage {
		storage[i] = byte(i)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		defer func() {
			// Cost is linear in the pickle: the most one byte can cost is
			// a MARK's 256-byte stack in gopickle (an EMPTY_DICT: 160), the
			// stack and memo grow by doubling, and one refused call may
			// print up to maxCallArgsPrint into its error. Anything
			// superlinear (a quadratic decode, an allocation sized by an
			// opcode's argument) breaks these bounds.
			runtime.ReadMemStats(&after)
			if alloc, limit := after.TotalAlloc-before.TotalAlloc, uint64(1<<20+1024*len(data)); alloc > limit {
				t.Errorf("%d-byte pickle allocated %d bytes, more than %d", len(data), alloc, limit)
			}
			if elapsed := time.Since(start); elapsed > time.Second {
				t.Errorf("%d-byte pickle took %v", len(data), elapsed)
			}
		}()
		sd, err := parseStateDict(data, fakeStorages)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		// Map and read every tensor the fuzzer made valid, as Open would.
		layouts := make([]*layout, 0, len(sd.tensors))
		for _, nv := range sd.tensors {
			l, err := checkView(nv.view)
			if err != nil {
				continue
			}
			if l.nbytes > int64(len(storage)) {
				t.Fatalf("%s: %d bytes from a storage of %d", nv.name, l.nbytes, len(storage))
			}
			layouts = append(layouts, l)
			r := l.reader(bytes.NewReader(append(make([]byte, 1000), storage...)))
			b, err := io.ReadAll(io.NewSectionReader(r, 0, l.nbytes))
			if err != nil || int64(len(b)) != l.nbytes {
				t.Fatalf("%s: read %d of %d bytes: %v", nv.name, len(b), l.nbytes, err)
			}
		}
		if len(layouts) == len(sd.tensors) {
			if err := checkAliasing(sd.tensors, layouts); err != nil && strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
		}
	})
}

// FuzzOpen feeds arbitrary bytes as a whole checkpoint file.
func FuzzOpen(f *testing.F) {
	for _, p := range seedFiles(f) {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tf, err := openReader("fuzz.bin", bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.bin: ") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q does not name the file on one line", err)
			}
			return
		}
		for _, tt := range tf.Tensors {
			if n := tt.NumBytes(); n <= 1<<16 {
				if _, err := io.ReadAll(io.NewSectionReader(tt.Data, 0, n)); err != nil {
					t.Fatalf("%s: %v", tt.Name, err)
				}
			}
		}
	})
}
