package torchbin

import (
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
)

var (
	errLegacy      = errors.New("legacy (pre-1.6) torch.save format is not supported; re-save it with torch.save(torch.load(path), path) on torch >= 1.6, or convert to safetensors")
	errTorchScript = errors.New("TorchScript archive, not a state dict; save model.state_dict() with torch.save")
)

// legacyMagic is the pickled magic number that opens a legacy torch.save
// stream: PROTO 2, LONG1 of 10 bytes 0x1950a86a20f9469cfc6c.
var legacyMagic = []byte("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19")

// sniff tells zip archives from the formats torch.save used before 1.6.
func sniff(r io.ReaderAt, size int64) error {
	head := make([]byte, min(size, 512))
	if _, err := readFull(r, head, 0); err != nil {
		return fmt.Errorf("reading header: %w", err)
	}
	switch {
	case bytes.HasPrefix(head, []byte("PK\x03\x04")), bytes.HasPrefix(head, []byte("PK\x05\x06")):
		return nil
	case bytes.HasPrefix(head, legacyMagic), len(head) > 0 && head[0] == 0x80:
		return errLegacy // a raw pickle stream
	case len(head) >= 262 && string(head[257:262]) == "ustar":
		return errLegacy // the tar layout of torch < 1.1 style saves
	}
	return errors.New("not a torch.save zip archive (no zip signature)")
}

// archive is the checked directory of a torch zip checkpoint.
type archive struct {
	size    int64
	prefix  string // the single top-level folder, with a trailing slash
	entries map[string]*zip.File
	offsets map[string]storageEntry
}

func openArchive(r io.ReaderAt, size int64) (*archive, error) {
	if err := sniff(r, size); err != nil {
		return nil, err
	}
	// zip.NewReader parses every directory record the file holds; each
	// takes at least 46 bytes of the file, so its cost grows with the
	// file's size and cannot be inflated by compression.
	zr, err := zip.NewReader(r, size)
	if err != nil {
		return nil, fmt.Errorf("corrupt zip archive: %w", err)
	}
	if len(zr.File) > maxZipEntries {
		return nil, fmt.Errorf("zip archive has %d entries, more than %d, the limit for one checkpoint file", len(zr.File), maxZipEntries)
	}
	a := &archive{size: size, entries: make(map[string]*zip.File, len(zr.File)), offsets: map[string]storageEntry{}}
	for _, zf := range zr.File {
		if _, dup := a.entries[zf.Name]; dup {
			return nil, fmt.Errorf("zip entry %q appears twice", zf.Name)
		}
		a.entries[zf.Name] = zf
	}
	var pickles []string
	for name := range a.entries {
		top, rest, ok := strings.Cut(name, "/")
		if !ok || top == "" {
			continue
		}
		if rest == "constants.pkl" || strings.HasPrefix(rest, "code/") {
			return nil, errTorchScript
		}
		if rest == "data.pkl" {
			pickles = append(pickles, name)
		}
	}
	switch len(pickles) {
	case 0:
		return nil, errors.New("zip archive has no <folder>/data.pkl; not a torch.save checkpoint")
	case 1:
	default:
		return nil, fmt.Errorf("zip archive has %d data.pkl entries (%s, ...); not a single torch.save checkpoint", len(pickles), pickles[0])
	}
	a.prefix = strings.TrimSuffix(pickles[0], "data.pkl")
	for name := range a.entries {
		if !strings.HasPrefix(name, a.prefix) {
			return nil, fmt.Errorf("zip entry %q lies outside the archive folder %q", name, a.prefix)
		}
	}
	if err := a.checkByteOrder(); err != nil {
		return nil, err
	}
	return a, nil
}

// checkByteOrder reads the optional byteorder entry (torch >= 2.1).
func (a *archive) checkByteOrder() error {
	zf, ok := a.entries[a.prefix+"byteorder"]
	if !ok {
		return nil // older torch wrote only little-endian archives
	}
	b, err := a.readSmall(zf, 16)
	if err != nil {
		return err
	}
	switch order := strings.TrimSpace(string(b)); order {
	case "little":
		return nil
	case "big":
		return errors.New("big-endian checkpoint (byteorder \"big\") is not supported; re-save it on a little-endian machine")
	default:
		return fmt.Errorf("byteorder entry says %q, want \"little\"", order)
	}
}

// readSmall reads a whole metadata entry of at most limit bytes. archive/zip
// checks the CRC when the read reaches the end.
func (a *archive) readSmall(zf *zip.File, limit int64) ([]byte, error) {
	if zf.UncompressedSize64 > uint64(limit) {
		return nil, fmt.Errorf("entry %s is %d bytes, more than the %d allowed", zf.Name, zf.UncompressedSize64, limit)
	}
	rc, err := zf.Open()
	if err != nil {
		return nil, fmt.Errorf("entry %s: %w", zf.Name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("entry %s: %w", zf.Name, err)
	}
	if int64(len(b)) > limit || uint64(len(b)) != zf.UncompressedSize64 {
		return nil, fmt.Errorf("entry %s: read %d bytes, directory says %d", zf.Name, len(b), zf.UncompressedSize64)
	}
	return b, nil
}

// readPickle reads data.pkl while scanPickle checks it (scanStream), so a
// hostile pickle is refused after reading only as far as its first excess,
// however large its entry claims to be. It returns the accepted pickle, up
// to its STOP opcode.
func (a *archive) readPickle() ([]byte, error) {
	b, err := a.scanPickleEntry(a.entries[a.prefix+"data.pkl"])
	if err != nil {
		return nil, fmt.Errorf("data.pkl: %w", err)
	}
	return b, nil
}

func (a *archive) scanPickleEntry(zf *zip.File) ([]byte, error) {
	if zf.UncompressedSize64 > maxPickleBytes {
		return nil, fmt.Errorf("%d bytes uncompressed, more than %d, the limit", zf.UncompressedSize64, maxPickleBytes)
	}
	rc, err := zf.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	// archive/zip stops at the declared size and checks the CRC at the
	// end; the LimitReader caps the read even if it did not.
	return scanStream(io.LimitReader(rc, int64(zf.UncompressedSize64)+1), int(zf.UncompressedSize64))
}

// lookup maps a storage key to its entry's bytes inside the file without
// reading them: storages must be stored uncompressed for that.
func (a *archive) lookup(key string) (storageEntry, error) {
	if se, ok := a.offsets[key]; ok {
		return se, nil
	}
	name := a.prefix + "data/" + key
	zf, ok := a.entries[name]
	if !ok {
		return storageEntry{}, fmt.Errorf("storage %q: entry %s is missing from the archive", key, name)
	}
	if zf.Method != zip.Store {
		return storageEntry{}, fmt.Errorf("storage %q: entry %s is compressed (zip method %d); torch.save stores storages uncompressed, so re-save the file with torch.save", key, name, zf.Method)
	}
	if zf.Flags&0x1 != 0 {
		return storageEntry{}, fmt.Errorf("storage %q: entry %s is encrypted", key, name)
	}
	if zf.CompressedSize64 != zf.UncompressedSize64 || zf.UncompressedSize64 > math.MaxInt64 {
		return storageEntry{}, fmt.Errorf("storage %q: entry %s has inconsistent sizes (%d stored, %d uncompressed)", key, name, zf.CompressedSize64, zf.UncompressedSize64)
	}
	nbytes := int64(zf.UncompressedSize64)
	off, err := zf.DataOffset()
	if err != nil {
		return storageEntry{}, fmt.Errorf("storage %q: entry %s: %w", key, name, err)
	}
	if off < 0 || off > a.size || nbytes > a.size-off {
		return storageEntry{}, fmt.Errorf("storage %q: entry %s (%d bytes at offset %d) runs past the end of the file (%d bytes); the file is truncated", key, name, nbytes, off, a.size)
	}
	se := storageEntry{nbytes: nbytes, offset: off}
	a.offsets[key] = se
	return se, nil
}
