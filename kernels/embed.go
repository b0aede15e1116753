// Package kernels holds moeprep's CUDA kernels (cuda/*.cu), their embedded
// fatbins (build/, made by scripts/build-kernels.sh on a GPU machine) and a
// typed Go API for each kernel family that checks shapes and returns errors.
//
// Nothing here needs CUDA to build: the fatbins are data, loaded through
// internal/cuda at run time.
package kernels

import (
	"embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// buildFS holds build/BUILD.json and build/<family>.fatbin.
//
//go:embed build
var buildFS embed.FS

// KernelsDirEnv names a directory whose <family>.fatbin files replace the
// embedded ones: the GPU test script uses it to test fatbins it has just
// built before they are embedded.
const KernelsDirEnv = "MOEPREP_KERNELS_DIR"

// BuildInfo is build/BUILD.json, written by scripts/build-kernels.sh.
type BuildInfo struct {
	NVCC    string        `json:"nvcc_version"`
	Flags   string        `json:"flags"`
	Built   string        `json:"built_at"`
	Kernels []BuiltKernel `json:"kernels"`
}

// BuiltKernel records one source and the fatbin built from it.
type BuiltKernel struct {
	Source       string `json:"source"` // file name under kernels/cuda
	SHA256       string `json:"sha256"` // of the source the fatbin was built from
	Fatbin       string `json:"fatbin"` // file name under kernels/build
	FatbinSHA256 string `json:"fatbin_sha256"`
}

// Build returns the build record in use: $MOEPREP_KERNELS_DIR/BUILD.json
// when that is set, else the embedded one.
func Build() (*BuildInfo, error) {
	var b []byte
	var err error
	if dir := os.Getenv(KernelsDirEnv); dir != "" {
		b, err = os.ReadFile(filepath.Join(dir, "BUILD.json"))
	} else {
		b, err = buildFS.ReadFile("build/BUILD.json")
	}
	if err != nil {
		return nil, fmt.Errorf("kernels: embedded build/BUILD.json: %w", err)
	}
	var info BuildInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("kernels: embedded build/BUILD.json: %w", err)
	}
	return &info, nil
}

// Image returns the fatbin of a kernel family ("gate", "align", ...): from
// $MOEPREP_KERNELS_DIR when set, else the embedded build.
func Image(family string) ([]byte, error) {
	name := family + ".fatbin"
	if dir := os.Getenv(KernelsDirEnv); dir != "" {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("kernels: %s (from $%s): %w", name, KernelsDirEnv, err)
		}
		return b, nil
	}
	b, err := buildFS.ReadFile("build/" + name)
	if err != nil {
		return nil, fmt.Errorf("kernels: no embedded build/%s: run scripts/build-kernels.sh on the GPU machine: %w", name, err)
	}
	return b, nil
}
