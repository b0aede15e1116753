package layout

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// FileInfo is one output file in the manifest.
type FileInfo struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // lower-case hex of the whole file
}

// Manifest is moeprep-manifest.json: every file of the output directory except
// the manifest itself, by path relative to the directory ("/"-separated).
type Manifest struct {
	Version int                 `json:"version"`
	Files   map[string]FileInfo `json:"files"`
}

// ReadManifest reads dir/moeprep-manifest.json.
func ReadManifest(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestFileName)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if m.Version != ContractVersion || m.Files == nil {
		return nil, fmt.Errorf("%s: version %d or no files", path, m.Version)
	}
	return &m, nil
}

// Verify rehashes every file the manifest lists under dir and reports the
// first mismatch. It reads every byte: use it when integrity matters more than time.
func (m *Manifest) Verify(dir string) error {
	names := make([]string, 0, len(m.Files))
	for n := range m.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		want := m.Files[n]
		got, err := HashFile(filepath.Join(dir, filepath.FromSlash(n)))
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s: size %d sha256 %s, manifest says size %d sha256 %s", filepath.Join(dir, n), got.Size, got.SHA256, want.Size, want.SHA256)
		}
	}
	return nil
}

// HashFile returns path's size and sha256.
func HashFile(path string) (FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileInfo{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, f, make([]byte, 1<<20))
	if err != nil {
		return FileInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	return FileInfo{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}
