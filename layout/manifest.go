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

	"github.com/zeebo/blake3"
	"github.com/zeebo/xxh3"
)

// FileInfo is one output file in the manifest: its size and exactly one of
// the SHA-256 of the whole file (small files), or a block digest (the
// safetensors shards moeprep writes): the hash of its blocks' hashes, which
// the writers compute in parallel in whatever order the blocks finish.
// Shards are written with XXH3-128 blocks (X3Blocks) unless convert's
// --digest asks for BLAKE3 (B3Blocks) or SHA-256 (Blocks); all three are
// read and checked.
type FileInfo struct {
	Size     int64       `json:"size"`
	SHA256   string      `json:"sha256,omitempty"`       // lower-case hex of the whole file
	Blocks   BlockDigest `json:"sha256_blocks,omitzero"` // SHA-256 blocks
	B3Blocks BlockDigest `json:"blake3_blocks,omitzero"` // BLAKE3 blocks
	X3Blocks BlockDigest `json:"xxh3_blocks,omitzero"`   // XXH3-128 blocks
}

// BlockDigest hashes a file as consecutive BlockSize-byte blocks (the last
// one may be shorter): Root is the lower-case hex hash of the concatenated
// hashes of the blocks (32 bytes each, 16 for XXH3-128, big-endian), in file
// order, with the same algorithm.
type BlockDigest struct {
	BlockSize int64  `json:"block_size"`
	Root      string `json:"root"`
}

// BlockAlgo is the hash of a block digest.
type BlockAlgo int

const (
	SHA256Blocks BlockAlgo = iota + 1
	BLAKE3Blocks
	XXH3Blocks
)

// ShardBlockAlgo is what moeprep's shard writers hash with by default.
//
// The manifest guards against corruption and torn writes (--resume,
// validate --bytes), not against someone who can edit the files: it sits
// unsigned next to them, so whoever can change a shard can rewrite its entry
// too, and a cryptographic hash buys nothing a non-cryptographic one with a
// 2^-128 chance of missing random damage does not. XXH3-128 hashes at about
// 21 GB/s on one core of the development machine against BLAKE3's 3.3 GB/s
// (SHA-256: 1.7 GB/s), and on 2 cores the hash of every output byte was what
// kept a conversion from the disk's speed (BENCHMARKS.md, issue 12).
// `--digest blake3` (or sha256) gives a cryptographic digest to pin.
const ShardBlockAlgo = XXH3Blocks

// ParseBlockAlgo reads a --digest value.
func ParseBlockAlgo(s string) (BlockAlgo, error) {
	for _, a := range []BlockAlgo{XXH3Blocks, BLAKE3Blocks, SHA256Blocks} {
		if s == a.String() {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown digest %q: want xxh3, blake3 or sha256", s)
}

func (a BlockAlgo) String() string {
	switch a {
	case BLAKE3Blocks:
		return "blake3"
	case XXH3Blocks:
		return "xxh3"
	}
	return "sha256"
}

// Size is the length of one block's digest.
func (a BlockAlgo) Size() int {
	if a == XXH3Blocks {
		return 16
	}
	return 32
}

// New returns an empty hash of the algorithm.
func (a BlockAlgo) New() hash.Hash {
	switch a {
	case BLAKE3Blocks:
		return blake3.New()
	case XXH3Blocks:
		return xxh128{xxh3.New()}
	}
	return sha256.New()
}

// xxh128 is XXH3-128 as a hash.Hash: Sum appends the 16-byte canonical
// (big-endian) digest that `xxhsum -H2` prints.
type xxh128 struct{ *xxh3.Hasher }

func (x xxh128) Sum(b []byte) []byte {
	d := x.Sum128().Bytes()
	return append(b, d[:]...)
}

func (x xxh128) Size() int { return 16 }

// ShardBlockSize is the block size moeprep's shard writers hash with. It is
// also the unit the direct writer assembles in memory and writes with
// O_DIRECT (convert/directwrite.go): small enough that the blocks a layer
// fills side by side fit in a few MiB each, large enough for the disk (4 MiB
// requests, as cp's write-back sends here). The manifest records it, so
// outputs hashed with the 16 MiB blocks of earlier versions still verify.
const ShardBlockSize = 4 << 20

// BlockInfo is the FileInfo of a file of size bytes hashed as blocks of bs
// bytes whose digests, in file order, are digests (each in the first
// a.Size() bytes of its array).
func BlockInfo(a BlockAlgo, size, bs int64, digests [][32]byte) FileInfo {
	h := a.New()
	for i := range digests {
		h.Write(digests[i][:a.Size()])
	}
	d := BlockDigest{BlockSize: bs, Root: hex.EncodeToString(h.Sum(nil))}
	switch a {
	case BLAKE3Blocks:
		return FileInfo{Size: size, B3Blocks: d}
	case XXH3Blocks:
		return FileInfo{Size: size, X3Blocks: d}
	}
	return FileInfo{Size: size, Blocks: d}
}

// blocks returns the file's block digest and its algorithm, or ok false for
// a whole-file SHA-256.
func (f FileInfo) blocks() (d BlockDigest, a BlockAlgo, ok bool) {
	switch {
	case f.X3Blocks.BlockSize > 0:
		return f.X3Blocks, XXH3Blocks, true
	case f.B3Blocks.BlockSize > 0:
		return f.B3Blocks, BLAKE3Blocks, true
	case f.Blocks.BlockSize > 0:
		return f.Blocks, SHA256Blocks, true
	}
	return BlockDigest{}, 0, false
}

// String describes the size and hash, for error messages.
func (f FileInfo) String() string {
	if d, a, ok := f.blocks(); ok {
		return fmt.Sprintf("size %d %s of %d-byte blocks %s", f.Size, a, d.BlockSize, d.Root)
	}
	return fmt.Sprintf("size %d sha256 %s", f.Size, f.SHA256)
}

// Hasher hashes a file streamed through it the way a manifest entry says:
// whole-file SHA-256, or block digests.
type Hasher struct {
	whole     hash.Hash
	algo      BlockAlgo
	blockSize int64
	block     hash.Hash
	inBlock   int64
	digests   [][32]byte
	n         int64
}

// NewHasher returns a Hasher for files described like want.
func NewHasher(like FileInfo) *Hasher {
	if d, a, ok := like.blocks(); ok {
		return &Hasher{algo: a, blockSize: d.BlockSize, block: a.New()}
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
	var d [32]byte
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
	return BlockInfo(h.algo, h.n, h.blockSize, h.digests)
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
		return fmt.Errorf("sha256_blocks block size %d", f.Blocks.BlockSize)
	case f.B3Blocks.BlockSize < 0 || f.B3Blocks.BlockSize > 1<<40:
		return fmt.Errorf("blake3_blocks block size %d", f.B3Blocks.BlockSize)
	case f.X3Blocks.BlockSize < 0 || f.X3Blocks.BlockSize > 1<<40:
		return fmt.Errorf("xxh3_blocks block size %d", f.X3Blocks.BlockSize)
	}
	n := 0
	for _, set := range []bool{f.SHA256 != "", f.Blocks.BlockSize != 0, f.B3Blocks.BlockSize != 0, f.X3Blocks.BlockSize != 0} {
		if set {
			n++
		}
	}
	if n != 1 {
		return errors.New("needs exactly one of sha256, sha256_blocks, blake3_blocks and xxh3_blocks")
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
// same algorithm and block size (on several cores) if like has them, the
// whole file otherwise.
func HashFileLike(path string, like FileInfo) (FileInfo, error) {
	d, algo, ok := like.blocks()
	if !ok {
		return HashFile(path)
	}
	bs := d.BlockSize
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
	digests := make([][32]byte, (size+bs-1)/bs)
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
			h := algo.New()
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
	return BlockInfo(algo, size, bs, digests), nil
}
