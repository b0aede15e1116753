package layout

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
)

// FileInfo is one output file in the manifest: its size and either the
// SHA-256 of the whole file (small files) or, for the safetensors shards
// moeprep writes, the SHA-256 of its blocks' SHA-256s (Blocks), which the
// writers compute in parallel in whatever order they finish the blocks.
type FileInfo struct {
	Size   int64       `json:"size"`
	SHA256 string      `json:"sha256,omitempty"`       // lower-case hex of the whole file
	Blocks BlockDigest `json:"sha256_blocks,omitzero"` // set instead of SHA256
}

// BlockDigest hashes a file as consecutive BlockSize-byte blocks (the last
// one may be shorter): Root is the lower-case hex SHA-256 of the
// concatenated 32-byte SHA-256 digests of the blocks, in file order.
type BlockDigest struct {
	BlockSize int64  `json:"block_size"`
	Root      string `json:"root"`
}

// ShardBlockSize is the block size moeprep's shard writers hash with: small
// enough that many blocks are in flight at once, large enough that the list
// of digests stays tiny (320 per 5 GB shard).
const ShardBlockSize = 16 << 20

// String describes the size and hash, for error messages.
func (f FileInfo) String() string {
	if f.Blocks.BlockSize > 0 {
		return fmt.Sprintf("size %d sha256 of %d-byte blocks %s", f.Size, f.Blocks.BlockSize, f.Blocks.Root)
	}
	return fmt.Sprintf("size %d sha256 %s", f.Size, f.SHA256)
}

// BlockRoot combines block digests, in file order, into BlockDigest.Root.
func BlockRoot(digests [][sha256.Size]byte) string {
	h := sha256.New()
	for i := range digests {
		h.Write(digests[i][:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Hasher hashes a file streamed through it the way a manifest entry says:
// whole-file SHA-256, or block digests when blockSize > 0.
type Hasher struct {
	whole     hash.Hash
	blockSize int64
	block     hash.Hash
	inBlock   int64
	digests   [][sha256.Size]byte
	n         int64
}

// NewHasher returns a Hasher for files described like want.
func NewHasher(like FileInfo) *Hasher {
	if like.Blocks.BlockSize > 0 {
		return &Hasher{blockSize: like.Blocks.BlockSize, block: sha256.New()}
	}
	return &Hasher{whole: sha256.New()}
}

func (h *Hasher) Write(p []byte) (int, error) {
	h.n += int64(len(p))
	if h.whole != nil {
		return h.whole.Write(p)
	}
	total := len(p)
	for len(p) > 0 {
		n := min(int64(len(p)), h.blockSize-h.inBlock)
		h.block.Write(p[:n])
		h.inBlock += n
		p = p[n:]
		if h.inBlock == h.blockSize {
			h.endBlock()
		}
	}
	return total, nil
}

func (h *Hasher) endBlock() {
	var d [sha256.Size]byte
	h.block.Sum(d[:0])
	h.digests = append(h.digests, d)
	h.block.Reset()
	h.inBlock = 0
}

// Sum is the FileInfo of everything written.
func (h *Hasher) Sum() FileInfo {
	if h.whole != nil {
		return FileInfo{Size: h.n, SHA256: hex.EncodeToString(h.whole.Sum(nil))}
	}
	if h.inBlock > 0 {
		h.endBlock()
	}
	return FileInfo{Size: h.n, Blocks: BlockDigest{BlockSize: h.blockSize, Root: BlockRoot(h.digests)}}
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
	for n, fi := range m.Files {
		if err := fi.check(); err != nil {
			return nil, fmt.Errorf("%s: file %s: %v", path, n, err)
		}
	}
	return &m, nil
}

// check refuses entries no file could match.
func (f FileInfo) check() error {
	switch {
	case f.Size < 0:
		return fmt.Errorf("size %d", f.Size)
	case f.Blocks.BlockSize < 0 || f.Blocks.BlockSize > 1<<40:
		return fmt.Errorf("block size %d", f.Blocks.BlockSize)
	case (f.SHA256 == "") == (f.Blocks.BlockSize == 0):
		return errors.New("needs exactly one of sha256 and sha256_blocks")
	}
	return nil
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
		path := filepath.Join(dir, filepath.FromSlash(n))
		got, err := HashFileLike(path, want)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s: %s, manifest says %s", path, got, want)
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

// HashFileLike hashes path the way like was hashed: block digests of the
// same block size (on several cores) if like has them, the whole file
// otherwise.
func HashFileLike(path string, like FileInfo) (FileInfo, error) {
	bs := like.Blocks.BlockSize
	if bs <= 0 {
		return HashFile(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return FileInfo{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return FileInfo{}, err
	}
	size := st.Size()
	digests := make([][sha256.Size]byte, (size+bs-1)/bs)
	next := make(chan int, len(digests))
	for i := range digests {
		next <- i
	}
	close(next)
	workers := min(runtime.GOMAXPROCS(0), 4, max(len(digests), 1))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			h := sha256.New()
			buf := make([]byte, min(bs, 1<<20))
			for i := range next {
				if errs[w] != nil {
					continue
				}
				h.Reset()
				off, end := int64(i)*bs, min(int64(i+1)*bs, size)
				if _, err := io.CopyBuffer(h, io.NewSectionReader(f, off, end-off), buf); err != nil {
					errs[w] = fmt.Errorf("%s: %w", path, err)
					continue
				}
				h.Sum(digests[i][:0])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return FileInfo{}, err
	}
	return FileInfo{Size: size, Blocks: BlockDigest{BlockSize: bs, Root: BlockRoot(digests)}}, nil
}
