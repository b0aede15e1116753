package placement

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"

	"github.com/moeprep/moeprep/safetensors"
)

// maxRowElems bounds one read of counts (a row of E counts, E ≤
// maxExperts): the binary readers stream rows, never a whole tensor.
// maxCells bounds what they hold, layers × experts summed counts (32 MiB
// of float64): a real model has tens of thousands (61 layers × 384), and
// a file must not make them allocate maxLayers × maxExperts.
// maxRecords bounds TensorRT-LLM's (iteration, layer) records over all
// rank files (a few hundred iterations of 61 layers in practice).
const (
	maxRowElems = maxExperts
	maxCells    = 1 << 22
	maxRecords  = 1 << 22
)

// checkFileSize refuses a binary statistics file over maxStatsBytes
// before anything in it is read: the count of snapshots, iterations and
// layers is then bounded by the bytes it takes to record them.
func checkFileSize(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", path)
	}
	if st.Size() > maxStatsBytes {
		return fmt.Errorf("%s: over %d MiB; moeprep reads statistics files up to that", path, maxStatsBytes>>20)
	}
	return nil
}

// addCounts reads n little-endian integer counts of dtype at off in r and
// adds them to dst (len n), refusing a negative count or a sum past 2^53.
// what names the place in the file for an error ("layer 3", say).
func addCounts(r io.ReaderAt, off int64, dtype safetensors.DType, dst []float64, file, what string) error {
	size := dtype.Size()
	if dtype != safetensors.I64 && dtype != safetensors.I32 {
		return fmt.Errorf("%s: %s: counts are %s; want I32 or I64 (integer token counts)", file, what, dtype)
	}
	if len(dst) > maxRowElems {
		return fmt.Errorf("%s: %s: %d experts, over the limit of %d", file, what, len(dst), maxRowElems)
	}
	buf := make([]byte, len(dst)*size)
	if _, err := r.ReadAt(buf, off); err != nil {
		return fmt.Errorf("%s: %s: reading counts: %v", file, what, err)
	}
	for e := range dst {
		var v int64
		if size == 8 {
			v = int64(binary.LittleEndian.Uint64(buf[e*8:]))
		} else {
			v = int64(int32(binary.LittleEndian.Uint32(buf[e*4:])))
		}
		if v < 0 || v > maxCount {
			return fmt.Errorf("%s: %s, expert %d: count %d is not a number of tokens (0 to 2^53)", file, what, e, v)
		}
		dst[e] += float64(v)
		if dst[e] > maxCount {
			return fmt.Errorf("%s: %s, expert %d: the counts sum past 2^53", file, what, e)
		}
	}
	return nil
}
