package convert

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/zeebo/xxh3"
)

// Source digests: what --resume checks before it reuses a finished shard.
//
// A shard is a function of the source bytes it was cut from and the options.
// Sizes and modification times do not prove the bytes unchanged (cp -p and
// rsync -t keep both across a change), so every chunk's source bytes are
// hashed with XXH3-128 as the writers read them, before any folding, and
// the shard's source digest is the XXH3-128 of those digests in chunk order.
// The chunks are fixed by the plan, which the progress fingerprint pins, so
// a resume reads each reused shard's chunks from the source again, whole,
// and must arrive at the same digest: it reads what a redo would read but
// writes nothing. XXH3 runs at about 20 GB/s a core, far above the disk.

// sourceDigests holds one digest per chunk of a shard.
type sourceDigests struct {
	sums [][16]byte
}

func newSourceDigests(chunks int) *sourceDigests {
	return &sourceDigests{sums: make([][16]byte, chunks)}
}

// note records the digest of chunk c's source bytes b (all of them).
func (d *sourceDigests) note(c *chunk, b []byte) {
	if d == nil {
		return
	}
	d.sums[c.idx] = xxh3.Hash128(b).Bytes()
}

// set records the digest of chunk c's source bytes hashed by h.
func (d *sourceDigests) set(c *chunk, h *xxh3.Hasher) {
	if d == nil {
		return
	}
	d.sums[c.idx] = h.Sum128().Bytes()
}

// root is the shard's source digest, lower-case hex.
func (d *sourceDigests) root() string {
	h := xxh3.New()
	for i := range d.sums {
		h.Write(d.sums[i][:])
	}
	b := h.Sum128().Bytes()
	return hex.EncodeToString(b[:])
}

// sourceDigest reads every chunk of shard s from the source again and
// returns the shard's source digest.
func (s *shardPlan) sourceDigest(ctx context.Context) (string, error) {
	chunks, err := s.planChunks()
	if err != nil {
		return "", err
	}
	defer s.releaseBands()
	d := newSourceDigests(len(chunks))
	var buf []byte
	for _, c := range chunks {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		if int64(cap(buf)) < c.n {
			buf = make([]byte, max(c.n, chunkSize))
		}
		b := buf[:c.n]
		if c.p.dq != nil { // the digest of what dequantising it reads
			if err := c.read(b, c.p.region, d); err != nil {
				return "", fmt.Errorf("checking the source of %s: %w", s.name, err)
			}
			continue
		}
		if err := c.p.region.readAt(b, c.pos); err != nil {
			return "", fmt.Errorf("checking the source of %s: %w", s.name, err)
		}
		d.note(c, b)
	}
	return d.root(), nil
}
