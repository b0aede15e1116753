package convert

import (
	"cmp"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moeprep/moeprep/internal/human"
)

// maxExcludePatterns bounds --exclude: a handful is what anyone writes.
const maxExcludePatterns = 256

// excludeMatches reports whether a --exclude pattern names the file rel
// (slash-separated, relative to SRC) or a folder above it: "original"
// and "original/*" both leave out everything under original/, "*.gguf"
// every .gguf beside the weights, as path.Match reads a pattern.
func excludeMatches(pattern, rel string) bool {
	for p := rel; p != "." && p != ""; p = path.Dir(p) {
		if ok, _ := path.Match(pattern, p); ok {
			return true
		}
	}
	return false
}

// applyExclude splits SRC's other files into those copied and those
// --exclude leaves out. A pattern that does not parse, names none of them,
// or names a file moeprep must read (a weight file, its index,
// config.json) is refused, naming the pattern: a typo must not pass for a
// choice, and the weights are not optional.
func applyExclude(patterns []string, others, needed []string) (kept, excluded []string, err error) {
	if len(patterns) == 0 {
		return others, nil, nil
	}
	if len(patterns) > maxExcludePatterns {
		return nil, nil, fmt.Errorf("--exclude given %d times, over the limit of %d", len(patterns), maxExcludePatterns)
	}
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil || p == "" || strings.HasPrefix(p, "/") || slices.Contains(strings.Split(p, "/"), "..") {
			return nil, nil, fmt.Errorf("--exclude %q: not a pattern of paths inside SRC (globs as in 'original', 'original/*', '*.gguf')", p)
		}
		for _, f := range needed {
			if excludeMatches(p, filepath.ToSlash(f)) {
				return nil, nil, fmt.Errorf("--exclude %q names %s, which moeprep reads to write the output; only the files it copies can be left out", p, f)
			}
		}
	}
	used := make([]bool, len(patterns))
	for _, f := range others {
		rel := filepath.ToSlash(f)
		out := false
		for i, p := range patterns {
			if excludeMatches(p, rel) {
				used[i], out = true, true
			}
		}
		if out {
			excluded = append(excluded, rel)
		} else {
			kept = append(kept, f)
		}
	}
	for i, p := range patterns {
		if !used[i] {
			return nil, nil, fmt.Errorf("--exclude %q names no file of SRC that moeprep would copy", p)
		}
	}
	slices.Sort(excluded)
	return kept, excluded, nil
}

// weightSuffixes are file types that hold model weights: a copied folder
// holding them is most likely another copy of the model (gpt-oss's
// original/ and metal/, a GGUF beside the safetensors).
var weightSuffixes = []string{".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".npz", ".h5", ".msgpack", ".onnx"}

// weightFolderNotices says, for each top-level folder among the copied
// files that holds weights of its own, its size and how to leave it out:
// the default copies everything, but never silently a second model. A
// folder counts when its weight files come to a quarter of the model's
// (modelBytes) or more: gpt-oss's original/ and metal/ are whole copies,
// while a folder of small golden tensors is not worth a line.
func weightFolderNotices(src string, copied []string, modelBytes int64) []string {
	type folder struct {
		files, weights int
		bytes          int64
		weightBytes    int64
	}
	folders := map[string]*folder{}
	var order []string
	for _, f := range copied {
		rel := filepath.ToSlash(f)
		top, rest, ok := strings.Cut(rel, "/")
		if !ok || rest == "" {
			continue
		}
		fd := folders[top]
		if fd == nil {
			fd = &folder{}
			folders[top] = fd
			order = append(order, top)
		}
		fd.files++
		var size int64
		if st, err := os.Stat(filepath.Join(src, f)); err == nil {
			size = st.Size()
		}
		fd.bytes += size
		lower := strings.ToLower(rel)
		for _, s := range weightSuffixes {
			if strings.HasSuffix(lower, s) {
				fd.weights++
				fd.weightBytes += size
				break
			}
		}
	}
	var out []string
	for _, top := range order {
		fd := folders[top]
		if fd.weights == 0 || fd.weightBytes*4 < modelBytes {
			continue
		}
		// One line of at most 100 columns for a folder name of 20 (issue
		// 46): the copied-files listing names the files.
		out = append(out, fmt.Sprintf("copying %s/, %s of weights (%s); --exclude '%s' leaves it out",
			top, human.Bytes(fd.weightBytes), human.Count(fd.files, "file"), top))
	}
	return out
}

// copiedFiles are SRC's files copied as they are, with their sizes,
// largest first (then by path): what --dry-run and the summary show.
func copiedFiles(src string, others []string) []CopiedFile {
	out := make([]CopiedFile, 0, len(others))
	for _, f := range others {
		c := CopiedFile{Path: filepath.ToSlash(f)}
		if st, err := os.Stat(filepath.Join(src, f)); err == nil {
			c.Bytes = st.Size()
		}
		out = append(out, c)
	}
	slices.SortStableFunc(out, func(a, b CopiedFile) int {
		if a.Bytes != b.Bytes {
			return cmp.Compare(b.Bytes, a.Bytes)
		}
		return strings.Compare(a.Path, b.Path)
	})
	return out
}
