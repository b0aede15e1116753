package layout

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"

	"github.com/zeebo/blake3"
	"github.com/zeebo/xxh3"

	"github.com/moeprep/moeprep/internal/cores"
	"github.com/moeprep/moeprep/internal/safeio"
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
// kept a conversion from the disk's speed (BENCHMARKS.md).
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

// MinBlockSize is the smallest block a manifest may hash a file in. moeprep
// writes 4 MiB blocks (ShardBlockSize; 16 MiB before); the floor only stops a
// manifest from asking for a digest every few bytes (1-byte blocks over a
// 0.5 GB shard cost 2.2 GB of digests), and with MaxBlocksPerFile it bounds
// both the digests and the per-block work. 512 bytes, a disk sector, is far
// below any block a writer would choose and still lets tests cut small files
// into several blocks (convert's tests write 777- and 4,096-byte blocks).
const MinBlockSize = 512

// MaxBlocksPerFile bounds the blocks one file is hashed in: 4 TiB of 4 MiB
// blocks, far past any shard (convert writes 5 GB ones by default), and at
// most 32 MiB of digests however the size and block size are chosen.
const MaxBlocksPerFile = 1 << 20

// maxManifestSize bounds moeprep-manifest.json, checked before it is read.
// An entry is about 150 bytes, so even an output of a thousand shards beside
// the 100,000 other files a checkpoint may carry writes 15 MB.
const maxManifestSize = 64 << 20

// maxManifestFiles bounds the files a manifest may list: the 100,000 other
// files a checkpoint may carry and the shards beside them, with room.
const maxManifestFiles = 1 << 18

// maxManifestKeys bounds a manifest's top-level keys, each remembered to
// refuse duplicates: moeprep writes two, version and files.
const maxManifestKeys = 16

// hashWindow is how many blocks HashFileLike hashes in parallel before
// folding their digests into the root: 32 KiB of digests, whatever the file.
const hashWindow = 1024

// BlockInfo is the FileInfo of a file of size bytes hashed as blocks of bs
// bytes whose digests, in file order, are digests (each in the first
// a.Size() bytes of its array).
func BlockInfo(a BlockAlgo, size, bs int64, digests [][32]byte) FileInfo {
	h := a.New()
	for i := range digests {
		h.Write(digests[i][:a.Size()])
	}
	return blockInfo(a, size, bs, h)
}

// blockInfo is the FileInfo whose root is root's sum: the hash of the block
// digests, written to it in file order.
func blockInfo(a BlockAlgo, size, bs int64, root hash.Hash) FileInfo {
	d := BlockDigest{BlockSize: bs, Root: hex.EncodeToString(root.Sum(nil))}
	switch a {
	case BLAKE3Blocks:
		return FileInfo{Size: size, B3Blocks: d}
	case XXH3Blocks:
		return FileInfo{Size: size, X3Blocks: d}
	}
	return FileInfo{Size: size, Blocks: d}
}

// BlockHash returns the file's block digest and its algorithm, or ok false
// for a whole-file SHA-256.
func (f FileInfo) BlockHash() (d BlockDigest, a BlockAlgo, ok bool) { return f.blocks() }

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
	if f.SHA256 == "" {
		return fmt.Sprintf("size %d (not hashed)", f.Size)
	}
	return fmt.Sprintf("size %d sha256 %s", f.Size, f.SHA256)
}

// Hasher hashes a file streamed through it the way a manifest entry says:
// whole-file SHA-256, or block digests. Each block's digest goes into the
// root as the block ends, so a Hasher holds no more than two hash states
// however long the stream.
type Hasher struct {
	whole     hash.Hash
	algo      BlockAlgo
	blockSize int64
	block     hash.Hash
	root      hash.Hash
	sum       [32]byte // a block's digest, on its way to root
	inBlock   int64
	n         int64
}

// NewHasher returns a Hasher for files described like want.
func NewHasher(like FileInfo) *Hasher {
	if d, a, ok := like.blocks(); ok {
		return &Hasher{algo: a, blockSize: d.BlockSize, block: a.New(), root: a.New()}
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
	h.root.Write(h.block.Sum(h.sum[:0]))
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
	return blockInfo(h.algo, h.n, h.blockSize, h.root)
}

// Manifest is moeprep-manifest.json: every file of the output directory except
// the manifest itself, by path relative to the directory ("/"-separated).
type Manifest struct {
	Version int                 `json:"version"`
	Files   map[string]FileInfo `json:"files"`
}

// ReadManifest reads dir/moeprep-manifest.json. Its size is checked before
// it is read (anything but a regular file is refused), its entries are
// counted as they are decoded, and every name must be a plain relative path
// inside dir. Every error names the manifest, and the entry where known.
func ReadManifest(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestFileName)
	b, err := safeio.ReadFile(path, maxManifestSize, ManifestFileName)
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return m, nil
}

// parseManifest decodes a manifest entry by entry, so that the count is
// bounded before the entries are built and duplicate names are refused
// (encoding/json would keep the last of two silently).
func parseManifest(b []byte) (*Manifest, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := openObject(dec, "the manifest"); err != nil {
		return nil, err
	}
	m := &Manifest{}
	seen := map[string]bool{}
	for dec.More() {
		key, err := objectKey(dec)
		if err != nil {
			return nil, err
		}
		if seen[key] {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		switch key {
		case "version":
			if err := dec.Decode(&m.Version); err != nil {
				return nil, fmt.Errorf("version: %s", jsonError(err))
			}
		case "files":
			// Counted before anything is built: a manifest of millions of
			// entries costs its bytes, not a map of them.
			n := countMembers(b[dec.InputOffset():])
			if n > maxManifestFiles {
				return nil, fmt.Errorf("lists %d files, over the limit of %d (a checkpoint carries at most 100,000 besides its shards)", n, maxManifestFiles)
			}
			if m.Files, err = decodeFiles(dec, n); err != nil {
				return nil, err
			}
		default:
			if len(seen) > maxManifestKeys {
				return nil, fmt.Errorf("more than %d top-level keys (want version and files)", maxManifestKeys)
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, errors.New(jsonError(err))
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, errors.New(jsonError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the JSON object")
	}
	if m.Version != ContractVersion || m.Files == nil {
		return nil, fmt.Errorf("version %d or no files", m.Version)
	}
	return m, nil
}

// decodeFiles decodes the files object, checking each name and entry.
func decodeFiles(dec *json.Decoder, n int) (map[string]FileInfo, error) {
	if err := openObject(dec, "files"); err != nil {
		return nil, err
	}
	files := make(map[string]FileInfo, n)
	for dec.More() {
		name, err := objectKey(dec)
		if err != nil {
			return nil, err
		}
		if err := checkRelPath(name); err != nil {
			return nil, fmt.Errorf("file %q: %v", name, err)
		}
		if _, dup := files[name]; dup {
			return nil, fmt.Errorf("file %s is listed twice", name)
		}
		if len(files) == maxManifestFiles {
			return nil, fmt.Errorf("lists more than %d files, the limit (a checkpoint carries at most 100,000 besides its shards)", maxManifestFiles)
		}
		var fi FileInfo
		if err := dec.Decode(&fi); err != nil {
			return nil, fmt.Errorf("file %s: %s", name, jsonError(err))
		}
		if err := fi.check(); err != nil {
			return nil, fmt.Errorf("file %s: %v", name, err)
		}
		files[name] = fi
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, errors.New(jsonError(err))
	}
	return files, nil
}

// countMembers counts the members of the JSON object that b starts with
// (after whitespace and the ':' before a value), by its colons outside
// strings and nested values; 0 if b does not start with an object. It
// allocates nothing and checks nothing: the decoder that follows does.
func countMembers(b []byte) int {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r' || b[i] == ':') {
		i++
	}
	if i == len(b) || b[i] != '{' {
		return 0
	}
	n, depth := 0, 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return n
			}
		case ':':
			if depth == 1 {
				n++
			}
		}
	}
	return n
}

// openObject reads a '{' token; what names the value for the error.
func openObject(dec *json.Decoder, what string) error {
	tok, err := dec.Token()
	if err != nil {
		return errors.New(jsonError(err))
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("%s is not a JSON object", what)
	}
	return nil
}

// objectKey reads the key of an object member.
func objectKey(dec *json.Decoder) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", errors.New(jsonError(err))
	}
	k, ok := tok.(string)
	if !ok {
		return "", errors.New("not valid JSON: an object key is not a string")
	}
	return k, nil
}

// jsonError says what is wrong with the JSON in words, without the Go types
// encoding/json names.
func jsonError(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON ends early"
	case errors.As(err, &syn):
		return fmt.Sprintf("not valid JSON at byte %d: %v", syn.Offset, err)
	case errors.As(err, &typ):
		want := "a number"
		switch typ.Type.Kind() {
		case reflect.String:
			want = "a string"
		case reflect.Struct, reflect.Map:
			want = "an object"
		case reflect.Int, reflect.Int64:
			want = "an integer"
		}
		if typ.Field != "" {
			return fmt.Sprintf("%s is %s, want %s", typ.Field, typ.Value, want)
		}
		return fmt.Sprintf("%s, want %s", typ.Value, want)
	}
	return "not valid JSON: " + err.Error()
}

// checkRelPath refuses a manifest entry name that is not a plain, clean,
// relative path inside the output directory: absolute, a ".." element
// (which would reach outside), an empty or "." element, a backslash (a
// separator elsewhere), a control character, or any other spelling that
// path.Clean would change. Every file moeprep writes is named so.
func checkRelPath(name string) error {
	switch {
	case name == "":
		return errors.New("empty name")
	case strings.ContainsRune(name, '\\'):
		return errors.New("holds a backslash")
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return errors.New("holds a control character")
	case path.IsAbs(name):
		return errors.New("an absolute path")
	}
	for _, el := range strings.Split(name, "/") {
		switch el {
		case "":
			return errors.New("an empty path element")
		case ".":
			return errors.New(`a "." path element`)
		case "..":
			return errors.New(`a ".." path element: outside the directory`)
		}
	}
	if path.Clean(name) != name {
		return errors.New("not a clean path")
	}
	return nil
}

// check refuses entries no file could match, and block digests that would
// cost more to compute than a file is worth: blocks under MinBlockSize, or
// more than MaxBlocksPerFile of them.
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
	if d, a, ok := f.blocks(); ok {
		key := map[BlockAlgo]string{SHA256Blocks: "sha256_blocks", BLAKE3Blocks: "blake3_blocks", XXH3Blocks: "xxh3_blocks"}[a]
		if d.BlockSize < MinBlockSize {
			return fmt.Errorf("%s block size %d is under the minimum of %d bytes (moeprep hashes %d-byte blocks)", key, d.BlockSize, MinBlockSize, ShardBlockSize)
		}
		if blocks := numBlocks(f.Size, d.BlockSize); blocks > MaxBlocksPerFile {
			return fmt.Errorf("%s: size %d in %d-byte blocks is %d blocks, over the limit of %d", key, f.Size, d.BlockSize, blocks, MaxBlocksPerFile)
		}
	}
	return nil
}

// numBlocks is how many blocks of bs bytes (bs > 0) hold size bytes.
func numBlocks(size, bs int64) int64 {
	n := size / bs
	if size%bs != 0 {
		n++
	}
	return n
}

// Verify rehashes every file the manifest lists under dir and reports the
// first mismatch. It reads every byte: use it when integrity matters more
// than time. A file whose size differs is reported without being read.
func (m *Manifest) Verify(dir string) error {
	names := slices.Sorted(maps.Keys(m.Files))
	for _, n := range names {
		want := m.Files[n]
		path := filepath.Join(dir, filepath.FromSlash(n))
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() && st.Size() != want.Size {
			return fmt.Errorf("%s: size %d, manifest says %s", path, st.Size(), want)
		}
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

// HashFile returns path's size and sha256. Anything but a regular file is
// refused (a device such as /dev/zero would never end).
func HashFile(path string) (FileInfo, error) {
	f, err := safeio.Open(path)
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
// whole file otherwise. Anything but a regular file is refused, and a file
// of more than MaxBlocksPerFile blocks. Blocks are hashed a window at a time
// and folded into the root in order, so memory does not grow with the file.
func HashFileLike(path string, like FileInfo) (FileInfo, error) {
	d, algo, ok := like.blocks()
	if !ok {
		return HashFile(path)
	}
	bs := d.BlockSize
	f, err := safeio.Open(path)
	if err != nil {
		return FileInfo{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return FileInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	size := st.Size()
	blocks := numBlocks(size, bs)
	if blocks > MaxBlocksPerFile {
		return FileInfo{}, fmt.Errorf("%s: %d bytes in %d-byte blocks is %d blocks, over the limit of %d", path, size, bs, blocks, MaxBlocksPerFile)
	}
	root := algo.New()
	digests := make([][32]byte, min(blocks, hashWindow))
	workers := min(cores.N(), 4, max(len(digests), 1))
	bufs := make([][]byte, workers)
	for first := int64(0); first < blocks; first += hashWindow {
		n := min(blocks-first, hashWindow)
		var next atomic.Int64
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				h := algo.New()
				if bufs[w] == nil {
					bufs[w] = make([]byte, min(bs, 1<<20))
				}
				for {
					i := next.Add(1) - 1
					if i >= n || errs[w] != nil {
						return
					}
					h.Reset()
					off := (first + i) * bs
					end := min(off+bs, size)
					if err := hashRange(h, f, off, end, bufs[w]); err != nil {
						errs[w] = fmt.Errorf("%s: %w", path, err)
						return
					}
					h.Sum(digests[i][:0])
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return FileInfo{}, err
		}
		for i := range n {
			root.Write(digests[i][:algo.Size()])
		}
	}
	return blockInfo(algo, size, bs, root), nil
}

// hashRange writes bytes [off, end) of f to h through buf.
func hashRange(h hash.Hash, f *os.File, off, end int64, buf []byte) error {
	for off < end {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), end-off)], off)
		h.Write(buf[:n])
		off += int64(n)
		if err == io.EOF && off < end {
			return io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			var pe *os.PathError
			if errors.As(err, &pe) {
				return pe.Err // the caller names the file
			}
			return err
		}
	}
	return nil
}
