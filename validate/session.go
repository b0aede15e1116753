// The session: a run's opened checkpoints, plans and contract, and the byte proof run over them.

package validate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/layout"
	"github.com/moeprep/moeprep/validate/byteproof"
	"github.com/moeprep/moeprep/validate/stream"
)

// session holds the opened inputs of a run.
type session struct {
	o        Options
	src, dst *checkpoint.Checkpoint
	srcPlan  *family.Plan
	dstPlan  *family.Plan
	contract *layout.Contract
	golden   string
	meter    *meter // nil: no byte progress
	// moeLayers are every MoE layer index of the checkpoints, sorted;
	// allLayers each of them on both sides (SRC and DST runs).
	moeLayers []int
	notices   []string // planNotices
	allLayers []target
	// goldenUnchecked are the targets --golden gave no golden tokens to
	// (no golden file, or a bank none of the golden's tokens took), which
	// the layer checks still run against SRC.
	goldenUnchecked []int
	// A streamed pass's tensor reads that no step held, and the shards
	// its byte proof read again in file order (pass.go; tests read them).
	streamMisses int64
	rechecked    int
	reread       int
	// passParts: the pass cuts large experts into parts (a CPU run's
	// pass: its paths read them a band at a time; pass.go).
	passParts bool
	// partsConsumed counts the parts let go as their bytes were consumed.
	partsConsumed atomic.Int64
}

func (s *session) close() {
	if s.src != nil {
		s.src.Close()
	}
	if s.dst != nil {
		s.dst.Close()
	}
}

// bytesReport is the report of a run that is the byte proof alone: no
// device, tokens or block size, which only the layer checks have.
func (s *session) bytesReport() *Report {
	return &Report{Mode: ModeBytes, runSetup: runSetup{Src: s.o.Src, Dst: s.o.Dst, Golden: s.golden, Device: "none"}, Notes: s.notices}
}

// planNotices sends what SRC's and DST's plans noticed (family.Plan.Notices,
// each once: DST's config.json is SRC's) to Notice and keeps them for the
// report's notes.
func (s *session) planNotices() []string {
	for _, p := range []*family.Plan{s.srcPlan, s.dstPlan} {
		if p == nil {
			continue
		}
		for _, n := range p.Notices {
			if !slices.Contains(s.notices, n) {
				s.notices = append(s.notices, n)
				s.o.notice("validate: " + n)
			}
		}
	}
	return s.notices
}

// bytesOnly is validate --bytes: the structural proof alone. With SRC
// and DST it runs as a streamed pass of no layers (pass.go): every byte
// of both read once, with O_DIRECT, reads in flight ahead of the proof,
// as a run with layer checks proves DST after them. CheckBytes' own
// file-order pass, through the page cache, is left for what the streamed
// proof does not take: a DST whose experts are stored as SRC stores them
// (layout as-stored). Cold, the streamed pass takes about half
// CheckBytes' time at a third of its CPU time on the development VM,
// whose buffered reads cost about a second of system time a GB
// (BENCHMARKS.md).
func (s *session) bytesOnly(ctx context.Context, rep *Report) error {
	if s.src != nil && s.dst != nil && !s.asStored() {
		return s.streamPass(ctx, nil, rep, true, nil, stream.Options{}, 0, nil)
	}
	s.planBytesOnly()
	return s.checkBytes(ctx, rep)
}

func (s *session) checkBytes(ctx context.Context, rep *Report) error {
	s.meter.startBytes()
	s.o.progress("validate: --bytes: every DST file against SRC, the contract and the manifest, every tensor byte for byte")
	perShard := s.o.Progress
	if s.meter != nil {
		perShard = nil // the byte reporter shows the progress, with a rate and an ETA
	}
	res, err := byteproof.CheckBytes(ctx, s.src, s.dst, s.srcPlan, s.contract, perShard)
	if err != nil {
		return err
	}
	rep.Bytes = res
	s.noteExcluded(rep)
	return nil
}

// noteExcluded says in the report which of SRC's files DST leaves out on
// purpose (convert --exclude, the contract's excluded_files), so a reader
// of a passing proof knows the copy is not all of SRC.
func (s *session) noteExcluded(rep *Report) {
	if s.contract == nil || len(s.contract.ExcludedFiles) == 0 {
		return
	}
	files := s.contract.ExcludedFiles
	more := ""
	if len(files) > 5 {
		files, more = files[:5], fmt.Sprintf(" and %d more", len(s.contract.ExcludedFiles)-5)
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("DST leaves out %d of SRC's files on purpose (convert --exclude; the contract's excluded_files): %s%s",
		len(s.contract.ExcludedFiles), strings.Join(files, ", "), more))
}

func (s *session) open() error {
	var err error
	if s.o.Src != "" {
		if s.src, err = checkpoint.Open(s.o.Src); err != nil {
			return err
		}
		if s.srcPlan, err = s.src.Plan(); err != nil {
			return err
		}
	}
	if s.o.Dst != "" {
		if s.dst, err = checkpoint.Open(s.o.Dst); err != nil {
			return err
		}
		c, ok, err := layout.ReadContract(s.dst.Config)
		if err != nil {
			err = fmt.Errorf("%s: %w", filepath.Join(s.o.Dst, checkpoint.ConfigFileName), err)
			if bad := (*layout.InvalidContractError)(nil); errors.As(err, &bad) {
				// it decodes and contradicts itself or its format: DST
				// is wrong, not unreadable
				return misfit(err)
			}
			return err
		}
		if !ok {
			return fmt.Errorf("%s: config.json has no %q contract: not moeprep convert/fuse-shared output", s.o.Dst, layout.ContractKey)
		}
		s.contract = c
		plan := family.PlanConverted
		if c.Layout == layout.AsStored {
			plan = family.PlanStored // DST's experts are named as SRC's
		}
		if s.dstPlan, err = plan(s.dst.Config, s.dst); err != nil {
			return fmt.Errorf("%s: %w", s.o.Dst, err)
		}
	}
	if s.o.Golden != "" {
		s.golden = s.o.Golden
		if st, err := os.Stat(s.golden); err != nil || !st.IsDir() {
			return fmt.Errorf("%s: not a golden directory", s.golden)
		}
		// A fixture directory keeps its goldens under reference/.
		if m, _ := filepath.Glob(filepath.Join(s.golden, "moe-layer-*.safetensors")); len(m) == 0 {
			if m, _ := filepath.Glob(filepath.Join(s.golden, "reference", "moe-layer-*.safetensors")); len(m) > 0 {
				s.golden = filepath.Join(s.golden, "reference")
			} else {
				return fmt.Errorf("%s: no moe-layer-L.safetensors goldens", s.golden)
			}
		}
	}
	return nil
}

func (s *session) dstPlanOrSrc() *family.Plan {
	if s.srcPlan != nil {
		return s.srcPlan
	}
	return s.dstPlan
}

// dequantized is the contract's record of a dequantised DST, nil when
// DST is not one.
func (s *session) dequantized() *layout.Dequantized {
	if s.contract == nil {
		return nil
	}
	return s.contract.Dequantized
}
