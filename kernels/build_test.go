package kernels_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/kernels"
)

// TestBuildMatchesSources is the CI guard (no GPU needed): every
// kernels/cuda/*.cu must have been built, from exactly its current text and
// that of the shared headers (kernels/cuda/*.cuh), into the embedded build
// (or $MOEPREP_KERNELS_DIR's when set).
func TestBuildMatchesSources(t *testing.T) {
	info, err := kernels.Build()
	if err != nil {
		t.Fatal(err)
	}
	built := map[string]kernels.BuiltKernel{}
	for _, k := range info.Kernels {
		built[k.Source] = k
	}
	sources, err := filepath.Glob(filepath.Join("cuda", "*.cu"))
	if err != nil || len(sources) == 0 {
		t.Fatalf("no kernels/cuda/*.cu found (%v)", err)
	}
	// Every source includes the shared headers it needs; scripts/build-kernels.sh
	// hashes each source followed by all of them, in name order.
	headers, err := filepath.Glob(filepath.Join("cuda", "*.cuh"))
	if err != nil {
		t.Fatal(err)
	}
	var shared []byte
	for _, h := range headers {
		b, err := os.ReadFile(h)
		if err != nil {
			t.Fatal(err)
		}
		shared = append(shared, b...)
	}
	for _, path := range sources {
		name := filepath.Base(path)
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(append(text, shared...))
		k, ok := built[name]
		switch {
		case !ok:
			t.Errorf("%s has no embedded build: run scripts/build-kernels.sh on the GPU machine", name)
			continue
		case k.SHA256 != hex.EncodeToString(sum[:]):
			t.Errorf("%s changed but its embedded build did not: run scripts/build-kernels.sh on the GPU machine", name)
			continue
		}
		img, err := kernels.Image(strings.TrimSuffix(name, ".cu"))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got := sha256.Sum256(img); hex.EncodeToString(got[:]) != k.FatbinSHA256 {
			t.Errorf("%s: %s differs from the one BUILD.json records", name, k.Fatbin)
		}
	}
	if len(info.Kernels) > 0 && !strings.Contains(info.NVCC, "release") {
		t.Errorf("BUILD.json records no nvcc version: %q", info.NVCC)
	}
	for _, k := range info.Kernels {
		if _, err := os.Stat(filepath.Join("cuda", k.Source)); err != nil {
			t.Errorf("BUILD.json lists %s, which kernels/cuda no longer holds", k.Source)
		}
	}
}
