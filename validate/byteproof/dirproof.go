package byteproof

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/internal/safeio"
	"github.com/moeprep/moeprep/layout"
)

// The directory half of the structural proof: every file of DST is
// accounted for. The tensor proof says nothing about the files beside the
// shards, and those are what a loader runs first: config.json, the
// tokenizer's chat template, a modeling_*.py that trust_remote_code
// executes. The manifest cannot vouch for them on its own (it sits unsigned
// beside them: whoever can change a file can rehash its entry), so each is
// tied to SRC instead:
//
//   - DST holds exactly the manifest's files: every entry is a plain
//     relative path to a regular file inside DST (checked element by
//     element with Lstat before anything is opened, so an entry cannot lead
//     to /dev/zero or out through a symlinked directory), and nothing else
//     is there: no unlisted file, link, pipe or device.
//   - config.json is SRC's config.json plus the "moeprep" contract and
//     nothing else, compared as decoded JSON.
//   - every other file that is not moeprep's own output (the shards and
//     their index) is a byte-for-byte copy of SRC's file of that name, and
//     every file moeprep copies from SRC is there.

// maxConfigBytes bounds the config.json read for the comparison, as the
// checkpoint package bounds its own read: real ones are a few KB.
const maxConfigBytes = 16 << 20

// copyChunk is the unit in which a copied file is compared with SRC's.
const copyChunk = 1 << 20

// readManifest reads DST's manifest after checking that it is a regular
// file: a named pipe in its place would block the read forever.
func readManifest(dir string) (*layout.Manifest, *ByteMismatch, error) {
	p := filepath.Join(dir, layout.ManifestFileName)
	mm := func(detail string) *ByteMismatch {
		return &ByteMismatch{Kind: MismatchManifest, File: p, Layer: -1, Expert: -1, Detail: detail}
	}
	st, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, mm("DST has no manifest: moeprep writes one with every output"), nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", p, unwrapPath(err))
	}
	if !st.Mode().IsRegular() {
		return nil, mm(safeio.Kind(st.Mode()) + ", not a regular file"), nil
	}
	m, err := layout.ReadManifest(dir)
	if err != nil {
		return nil, &ByteMismatch{Kind: MismatchManifest, Layer: -1, Expert: -1, Detail: err.Error()}, nil
	}
	return m, nil, nil
}

// plainRel reports whether a manifest name is a plain path inside the
// directory: relative, "/"-separated, clean, no "." or ".." element, no
// empty one. Anything else could name a file outside DST.
func plainRel(rel string) bool {
	if rel == "" || strings.ContainsRune(rel, 0) || path.IsAbs(rel) || path.Clean(rel) != rel {
		return false
	}
	native := filepath.FromSlash(rel)
	if filepath.IsAbs(native) || filepath.VolumeName(native) != "" {
		return false
	}
	for _, part := range strings.Split(rel, "/") {
		if part == "" || part == "." || part == ".." || strings.ContainsRune(part, filepath.Separator) {
			return false
		}
	}
	return true
}

// checkTree proves that DST holds exactly the files its manifest lists,
// each a regular file reached through real directories. Entries are
// checked before any of them is opened.
func checkTree(dir string, man *layout.Manifest) (*ByteMismatch, error) {
	names := sortedKeys(man.Files)
	dirs := map[string]bool{}
	for _, rel := range names {
		if !plainRel(rel) {
			return &ByteMismatch{Kind: MismatchManifest, File: filepath.Join(dir, layout.ManifestFileName), Layer: -1, Expert: -1,
				Detail: fmt.Sprintf("entry %q is not a plain relative path inside DST", rel)}, nil
		}
		if rel == layout.ManifestFileName {
			return &ByteMismatch{Kind: MismatchManifest, File: filepath.Join(dir, rel), Layer: -1, Expert: -1,
				Detail: "the manifest lists itself; it cannot hold its own hash"}, nil
		}
		if mm, err := checkEntry(dir, rel); mm != nil || err != nil {
			return mm, err
		}
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	return walkTree(dir, "", man.Files, dirs)
}

// checkEntry checks one manifest entry with Lstat on every element of its
// path: each parent a directory (not a link to one), the file itself a
// regular file.
func checkEntry(dir, rel string) (*ByteMismatch, error) {
	parts := strings.Split(rel, "/")
	p := dir
	for i, part := range parts {
		p = filepath.Join(p, part)
		st, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return &ByteMismatch{Kind: MismatchMissing, File: filepath.Join(dir, filepath.FromSlash(rel)), Layer: -1, Expert: -1,
				Detail: "listed in " + layout.ManifestFileName + ", not in DST"}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, unwrapPath(err))
		}
		switch last := i == len(parts)-1; {
		case !last && !st.IsDir():
			return &ByteMismatch{Kind: MismatchFile, File: p, Layer: -1, Expert: -1,
				Detail: fmt.Sprintf("%s, not a directory, on the path of the manifest's %s", safeio.Kind(st.Mode()), rel)}, nil
		case last && !st.Mode().IsRegular():
			return &ByteMismatch{Kind: MismatchFile, File: p, Layer: -1, Expert: -1,
				Detail: safeio.Kind(st.Mode()) + "; moeprep writes only regular files"}, nil
		}
	}
	return nil, nil
}

// walkTree visits DST's directory rel without following links and fails
// on anything the manifest does not account for.
func walkTree(dir, rel string, listed map[string]layout.FileInfo, dirs map[string]bool) (*ByteMismatch, error) {
	at := filepath.Join(dir, filepath.FromSlash(rel))
	entries, err := os.ReadDir(at)
	if err != nil {
		return nil, fmt.Errorf("%s: listing files: %w", at, unwrapPath(err))
	}
	for _, e := range entries {
		r := path.Join(rel, e.Name())
		p := filepath.Join(dir, filepath.FromSlash(r))
		mm := func(detail string) (*ByteMismatch, error) {
			return &ByteMismatch{Kind: MismatchFile, File: p, Layer: -1, Expert: -1, Detail: detail}, nil
		}
		switch t := e.Type(); {
		case t.IsDir():
			if !dirs[r] {
				return mm("a directory holding no file the manifest lists; moeprep writes no such directory")
			}
			if m, err := walkTree(dir, r, listed, dirs); m != nil || err != nil {
				return m, err
			}
		case t.IsRegular():
			if _, ok := listed[r]; !ok && r != layout.ManifestFileName {
				return mm("not listed in " + layout.ManifestFileName + "; moeprep writes no such file")
			}
		default:
			return mm(safeio.Kind(t) + "; moeprep writes only regular files")
		}
	}
	return nil, nil
}

// checkCopiesListed ties the manifest's files to SRC's: each one is
// moeprep's own output (ours) or a file moeprep copies from SRC, and every
// file it copies is listed. It returns the copies to compare.
func checkCopiesListed(src *checkpoint.Checkpoint, dstDir string, man *layout.Manifest, ours map[string]bool, c *layout.Contract) (map[string]bool, *ByteMismatch, error) {
	others, err := src.OtherFiles()
	if err != nil {
		return nil, nil, err
	}
	copies := map[string]bool{}
	// Files convert --exclude left out on purpose, as the contract lists
	// them: each must be SRC's and absent from DST; any other file of SRC
	// missing from DST is still a failure.
	excluded := map[string]bool{}
	for _, f := range c.ExcludedFiles {
		excluded[f] = true
	}
	for _, f := range others {
		if !copiedDequant(c, f) {
			continue // a dequantised DST has no hf_quant_config.json; listed, it fails below
		}
		rel := filepath.ToSlash(f)
		p := filepath.Join(dstDir, f)
		if excluded[rel] {
			delete(excluded, rel)
			if _, listed := man.Files[rel]; listed {
				return nil, &ByteMismatch{Kind: MismatchFile, File: p, Layer: -1, Expert: -1,
					Detail: fmt.Sprintf("the contract's excluded_files names %s, but DST's manifest lists it", rel)}, nil
			}
			continue
		}
		switch _, listed := man.Files[rel]; {
		case ours[rel]:
			return nil, &ByteMismatch{Kind: MismatchFile, File: p, Layer: -1, Expert: -1,
				Detail: fmt.Sprintf("SRC's %s has the name of moeprep's own output, so it was not copied; moeprep refuses such a SRC", rel)}, nil
		case !listed:
			return nil, &ByteMismatch{Kind: MismatchFile, File: p, Layer: -1, Expert: -1,
				Detail: fmt.Sprintf("SRC has %s and DST does not: moeprep copies every file of SRC besides its weights and config.json", rel)}, nil
		}
		copies[rel] = true
	}
	for _, rel := range sortedKeys(excluded) {
		return nil, &ByteMismatch{Kind: MismatchContract, File: filepath.Join(dstDir, "config.json"), Layer: -1, Expert: -1,
			Detail: fmt.Sprintf("the contract's excluded_files names %s, which is no file of SRC that moeprep copies", rel)}, nil
	}
	for _, rel := range sortedKeys(man.Files) {
		if !ours[rel] && !copies[rel] {
			return nil, &ByteMismatch{Kind: MismatchFile, File: filepath.Join(dstDir, filepath.FromSlash(rel)), Layer: -1, Expert: -1,
				Detail: "listed in the manifest, but neither moeprep's own output nor a file moeprep copies from SRC (SRC has no such file)"}, nil
		}
	}
	return copies, nil, nil
}

// checkCopy compares DST's copy with SRC's file in bounded chunks, hashing
// DST's bytes the way the manifest did. SRC's file may be a link (a hub
// cache's snapshot links into blobs/): safeio.Open follows it and refuses
// anything but a regular file at its end.
func checkCopy(ctx context.Context, dstPath, srcPath string, like layout.FileInfo) (layout.FileInfo, *ByteMismatch, error) {
	d, err := safeio.Open(dstPath)
	if err != nil {
		return layout.FileInfo{}, nil, err
	}
	defer d.Close()
	s, err := safeio.Open(srcPath)
	if err != nil {
		return layout.FileInfo{}, nil, err
	}
	defer s.Close()
	mm := func(off int64, detail string) (layout.FileInfo, *ByteMismatch, error) {
		return layout.FileInfo{}, &ByteMismatch{Kind: MismatchCopy, File: dstPath, Layer: -1, Expert: -1, Offset: off, Detail: detail}, nil
	}
	h := layout.NewHasher(like)
	got, want := make([]byte, copyChunk), make([]byte, copyChunk)
	var off int64
	for {
		if err := ctx.Err(); err != nil {
			return layout.FileInfo{}, nil, err
		}
		n, derr := io.ReadFull(d, got)
		if derr != nil && derr != io.EOF && derr != io.ErrUnexpectedEOF {
			return layout.FileInfo{}, nil, fmt.Errorf("%s: %w", dstPath, derr)
		}
		h.Write(got[:n])
		m, serr := io.ReadFull(s, want[:n])
		if serr != nil && serr != io.EOF && serr != io.ErrUnexpectedEOF {
			return layout.FileInfo{}, nil, fmt.Errorf("%s: %w", srcPath, serr)
		}
		if i := firstDiff(got[:m], want[:m]); i < m {
			return mm(off+int64(i), fmt.Sprintf("DST byte %#02x, SRC %s byte %#02x", got[i], srcPath, want[i]))
		}
		if m < n {
			return mm(off+int64(m), fmt.Sprintf("SRC %s ends at byte %d, DST's copy goes on", srcPath, off+int64(m)))
		}
		off += int64(n)
		if derr != nil {
			break
		}
	}
	if k, err := s.Read(want[:1]); k > 0 {
		return mm(off, fmt.Sprintf("DST's copy ends at byte %d, SRC %s goes on", off, srcPath))
	} else if err != nil && err != io.EOF {
		return layout.FileInfo{}, nil, fmt.Errorf("%s: %w", srcPath, err)
	}
	return h.Sum(), nil, nil
}

// checkConfigFile reads DST's config.json once, hashes it for the manifest
// and proves it is SRC's config plus exactly the contract c: SRC's keys
// with SRC's values (but quantization_config, which a dequantised DST must
// not have), and a "moeprep" object that holds c as moeprep writes it and
// nothing else.
func checkConfigFile(p string, like layout.FileInfo, srcPath string, srcJSON []byte, c *layout.Contract) (layout.FileInfo, *ByteMismatch, error) {
	b, err := safeio.ReadFile(p, maxConfigBytes, "config.json")
	if err != nil {
		return layout.FileInfo{}, nil, err
	}
	h := layout.NewHasher(like)
	h.Write(b)
	mm := func(kind, detail string) (layout.FileInfo, *ByteMismatch, error) {
		return layout.FileInfo{}, &ByteMismatch{Kind: kind, File: p, Layer: -1, Expert: -1, Detail: detail}, nil
	}
	sv, sdups, err := decodeJSON(srcJSON)
	if err != nil {
		return layout.FileInfo{}, nil, fmt.Errorf("%s: %v", srcPath, err)
	}
	srcCfg, ok := sv.(map[string]any)
	if !ok {
		return layout.FileInfo{}, nil, fmt.Errorf("%s: not a JSON object", srcPath)
	}
	if _, has := srcCfg[layout.ContractKey]; has {
		return layout.FileInfo{}, nil, fmt.Errorf("%s: has a %q key of its own: SRC is moeprep output, not the checkpoint DST was converted from", srcPath, layout.ContractKey)
	}
	if c.Dequantized != nil {
		delete(srcCfg, quantizationConfigKey)
		delete(srcCfg, expertDTypeKey) // DeepSeek-V4's "fp4": no longer so
	}
	dv, ddups, err := decodeJSON(b)
	if err != nil {
		return mm(MismatchConfig, err.Error())
	}
	dstCfg, ok := dv.(map[string]any)
	if !ok {
		return mm(MismatchConfig, "not a JSON object")
	}
	for _, d := range ddups {
		if !slices.Contains(sdups, d) {
			return mm(MismatchConfig, fmt.Sprintf("%s appears more than once (SRC has it once): readers disagree on which one counts", d))
		}
	}
	got, has := dstCfg[layout.ContractKey]
	if !has {
		return mm(MismatchConfig, fmt.Sprintf("no %q key", layout.ContractKey))
	}
	delete(dstCfg, layout.ContractKey)
	if d := firstJSONDiff(srcCfg, dstCfg, "", true); d != nil {
		return mm(MismatchConfig, d.describe("SRC", "DST"))
	}
	want, err := contractJSON(c)
	if err != nil {
		return layout.FileInfo{}, nil, err
	}
	if d := firstJSONDiff(want, got, layout.ContractKey, false); d != nil {
		return mm(MismatchContract, d.describe("moeprep's encoding of the contract", "DST"))
	}
	return h.Sum(), nil, nil
}

// contractJSON is c (the contract, or a part of it) as moeprep writes it,
// decoded for comparison.
func contractJSON(c any) (any, error) {
	b, err := jsonMarshal(c)
	if err != nil {
		return nil, err
	}
	v, _, err := decodeJSON(b)
	return v, err
}

// jsonMarshal encodes v without HTML escaping, as text for people.
func jsonMarshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := newJSONEncoder(&buf)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// quantizationConfigKey is the config.json key a dequantised DST drops.
const quantizationConfigKey = "quantization_config"

// expertDTypeKey is DeepSeek-V4's expert_dtype, which a dequantised DST
// drops too.
const expertDTypeKey = "expert_dtype"
