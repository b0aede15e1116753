package convert

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/moeprep/moeprep/layout"
	"golang.org/x/sync/errgroup"
)

// copyBufSize bounds every copy buffer.
const copyBufSize = 1 << 20

// copyFile copies a regular file, hashing it on the way; the caller syncs it
// (syncFiles).
func copyFile(src, dst string) (layout.FileInfo, error) {
	in, err := os.Open(src)
	if err != nil {
		return layout.FileInfo{}, err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return layout.FileInfo{}, err
	}
	out, err := os.Create(dst)
	if err != nil {
		return layout.FileInfo{}, err
	}
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(out, h), in, make([]byte, copyBufSize))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return layout.FileInfo{}, fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return layout.FileInfo{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// writeFile writes b to path and returns its manifest entry; the caller
// syncs it (syncFiles).
func writeFile(path string, b []byte) (layout.FileInfo, error) {
	f, err := os.Create(path)
	if err != nil {
		return layout.FileInfo{}, err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return layout.FileInfo{}, fmt.Errorf("%s: %w", path, err)
	}
	sum := sha256.Sum256(b)
	return layout.FileInfo{Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:])}, nil
}

// writeFileAtomic writes path via a temporary name and rename, unsynced.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if _, err := writeFile(tmp, b); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// syncFiles fsyncs the files, then their directories, with up to
// syncParallel syncs in flight: the file system commits concurrent syncs
// together (one journal commit on ext4 where one after the other would wait
// for one each, tens of milliseconds apiece on a slow disk). A directory that
// refuses to sync is let be, as syncDir does.
func syncFiles(files []string) error {
	var g errgroup.Group
	g.SetLimit(syncParallel)
	dirs := map[string]bool{}
	for _, p := range files {
		dirs[filepath.Dir(p)] = true
		g.Go(func() error {
			f, err := os.Open(p)
			if err == nil {
				err = f.Sync()
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				return fmt.Errorf("%s: sync: %w", p, err)
			}
			return nil
		})
	}
	for d := range dirs {
		g.Go(func() error { return syncDir(d) })
	}
	return g.Wait()
}

// syncParallel bounds syncFiles' goroutines and open files, however many
// files a checkpoint carries besides its weights.
const syncParallel = 16

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	_ = d.Sync() // some filesystems refuse directory sync; the rename is what matters
	return nil
}

// configWithContract is the source config.json with the contract added as its
// last key. The source's bytes are kept as they are (key order, formatting,
// quantization_config), so loaders see exactly the config they knew; a
// dequantised output (c.Dequantized) drops quantization_config, which
// would tell loaders to expect scales that are no longer there.
func configWithContract(src []byte, c *layout.Contract) ([]byte, error) {
	cb, err := json.MarshalIndent(c, "  ", "  ")
	if err != nil {
		return nil, err
	}
	if c.Dequantized != nil {
		for _, k := range DequantizedDropKeys {
			if src, err = withoutKey(src, k); err != nil {
				return nil, err
			}
		}
	}
	body := bytes.TrimRight(src, " \t\r\n")
	if len(body) == 0 || body[len(body)-1] != '}' {
		return nil, fmt.Errorf("not a JSON object")
	}
	body = body[:len(body)-1]
	inner := bytes.TrimRight(body, " \t\r\n")
	var out bytes.Buffer
	out.Write(inner)
	if len(inner) > 0 && inner[len(inner)-1] != '{' {
		out.WriteByte(',')
	}
	out.WriteString("\n  \"" + layout.ContractKey + "\": ")
	out.Write(cb)
	out.WriteString("\n}\n")
	var check map[string]any
	if err := json.Unmarshal(out.Bytes(), &check); err != nil {
		return nil, fmt.Errorf("adding the contract: %v", err)
	}
	return out.Bytes(), nil
}

func manifestJSON(files map[string]layout.FileInfo) ([]byte, error) {
	b, err := json.MarshalIndent(layout.Manifest{Version: layout.ContractVersion, Files: files}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// QuantizationConfigKey is the config.json key a dequantised output drops.
const QuantizationConfigKey = "quantization_config"

// DequantizedDropKeys are the top-level config.json keys a dequantised
// output drops: quantization_config, and DeepSeek-V4's expert_dtype
// ("fp4": its experts are no longer FP4).
var DequantizedDropKeys = []string{QuantizationConfigKey, "expert_dtype"}

// withoutKey is the JSON object src without its top-level member key (every
// one of them, were it repeated), every other byte as it was: the comma
// before the member goes with it, or after it when it is the first.
func withoutKey(src []byte, key string) ([]byte, error) {
	for range maxKeyRepeats {
		dec := json.NewDecoder(bytes.NewReader(src))
		if t, err := dec.Token(); err != nil || t != json.Delim('{') {
			return nil, fmt.Errorf("not a JSON object")
		}
		prev, first, found := dec.InputOffset(), true, false
		for dec.More() {
			t, err := dec.Token()
			if err != nil {
				return nil, err
			}
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return nil, err
			}
			end := dec.InputOffset()
			if k, _ := t.(string); k != key {
				prev, first = end, false
				continue
			}
			if !first {
				src = append(append([]byte(nil), src[:prev]...), src[end:]...)
			} else {
				start := prev + int64(len(src[prev:])-len(bytes.TrimLeft(src[prev:], " \t\r\n")))
				next := bytes.TrimLeft(src[end:], " \t\r\n")
				if len(next) > 0 && next[0] == ',' {
					end = int64(len(src) - len(bytes.TrimLeft(next[1:], " \t\r\n")))
				}
				src = append(append([]byte(nil), src[:start]...), src[end:]...)
			}
			found = true
			break
		}
		if !found {
			return src, nil
		}
	}
	return nil, fmt.Errorf("%q appears more than %d times", key, maxKeyRepeats)
}

// maxKeyRepeats bounds how often withoutKey removes a repeated key.
const maxKeyRepeats = 16
