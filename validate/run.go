// Run: the order of a validate run (options, opening, the device, the layer checks on the CPU or GPU,
// the byte proof); each step lives in a file of its own.

package validate

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/moeprep/moeprep/internal/exitcode"
	"github.com/moeprep/moeprep/validate/judge"
)

// Run validates the layers of o and returns the report. An error means the
// input could not be checked (exit 2); a completed run whose checks fail
// returns a report with Failed() true and no error (Report.Err gives the
// exit-1 error).
func Run(ctx context.Context, o Options) (*Report, error) {
	start := time.Now()
	asked := strings.ToLower(strings.TrimSpace(string(o.Device)))
	devNotes, err := o.norm()
	if err != nil {
		return nil, err
	}
	s := &session{o: o, meter: newMeter(o.ByteProgress)}
	if s.meter != nil && o.Progress != nil {
		// Before anything is read; -q (no Progress) leaves it out, and
		// --json's report never holds it: it is not a result.
		s.meter.planned = func(layerBytes, proofBytes int64) {
			s.o.progress("%s", estimate(s.runSize(layerBytes, proofBytes)))
		}
	}
	defer s.close()
	if err := s.open(); err != nil {
		return nil, err
	}
	devNotes = append(devNotes, s.planNotices()...)
	if o.Device == DeviceCUDA && o.Bytes != BytesOnly {
		if why := s.gpuRefusal(); why != "" {
			note, err := o.GPURefused(asked, why)
			if err != nil {
				return nil, err
			}
			devNotes = append(devNotes, note)
			s.o.Device = o.Device
		}
	}
	if s.srcPlan != nil && s.dstPlan != nil {
		if err := s.sameModel(); err != nil {
			return s.notFromSrc(ctx, err, start)
		}
	}
	if o.Bytes == BytesOnly {
		rep := s.bytesReport()
		if err := s.bytesOnly(ctx, rep); err != nil {
			return nil, err
		}
		rep.Seconds = time.Since(start).Seconds()
		return rep, nil
	}
	targets, notes, err := s.targets()
	if err != nil {
		if exitcode.IsCheckFailure(err) && s.srcPlan != nil && s.dstPlan != nil {
			// DST's contract does not fit DST or SRC: the proof names
			// the file and key where it can, as for sameModel
			return s.notFromSrc(ctx, err, start)
		}
		return nil, err
	}
	if err := s.stacksFit(targets); err != nil {
		if s.srcPlan != nil {
			return s.notFromSrc(ctx, err, start)
		}
		return nil, err
	}
	withBytes := o.Bytes == BytesAuto && s.src != nil && s.dst != nil
	mode := ModeLayers
	if withBytes {
		mode = ModeLayersBytes
	}
	rep := &Report{Mode: mode, runSetup: runSetup{Src: o.Src, Dst: o.Dst, Golden: s.golden, Device: o.Device}, Tokens: o.Tokens, Seed: o.Seed,
		BlockSize: o.BlockSize, XDraw: XDraw, Notes: append(devNotes, notes...), LayerSelection: strings.TrimSpace(o.Layers),
		SampleExperts: o.SampleExperts, MoELayers: s.moeLayers}
	rep.LayersChecked, rep.LayersNotChecked = splitLayers(s.moeLayers, targets)
	rep.GoldenNotChecked = s.goldenUnchecked
	if n := s.capJobs(targets); n != "" { // jobs bounded by cores and memory (jobs.go)
		rep.Notes = append(rep.Notes, n)
		o.progress("validate: %s", n)
	}
	if d := s.dequantized(); d != nil {
		tol := judge.Lookup(judge.FusedVsReference).Tolerance(judge.Situation{Dequantised: d.DType})
		rep.Notes = append(rep.Notes, fmt.Sprintf("DST's quantised weights were dequantised to %s (%s): the layer checks allow one rounding of every weight (%s, rel_l2 %.3g); the byte proof holds every dequantised value to the one rounding of SRC's exact dequantisation, bit for bit",
			d.DType, d.Rounding, tol.Name, tol.MaxRelL2))
	}
	defer func() {
		if rep != nil {
			rep.finishCoverage(s.o.SampleExperts)
			rep.ExpertGaps = s.expertGaps(targets, rep)
		}
	}()
	if o.Device == DeviceCUDA {
		rep.CPUCheck = o.CPUCheck
	} else {
		if o.IOBaseline {
			rep.Notes = append(rep.Notes, "no I/O baseline: it times uploads to the GPU, and this run is on the CPU")
		}
		if o.GPUPrecision != PrecisionBF16 {
			// --device auto fell back to the CPU: the precision asked for
			// did not apply, and the report must not read as if it had.
			rep.Notes = append(rep.Notes, fmt.Sprintf("GPU precision %s not applied: it sets the GPU's activations, and this run is on the CPU", o.GPUPrecision))
		}
	}
	if o.Device == DeviceCUDA && s.gpuStreams(targets) {
		if err := s.runGPUStreamed(ctx, targets, rep, withBytes); err != nil {
			return nil, err
		}
		rep.Seconds = time.Since(start).Seconds()
		return rep, nil
	}
	if o.Device != DeviceCUDA && s.src != nil && s.dst != nil && !s.asStored() {
		if err := s.runStreamed(ctx, targets, rep, withBytes); err != nil {
			return nil, err
		}
		rep.Seconds = time.Since(start).Seconds()
		return rep, nil
	}
	s.planProgress(targets, withBytes)
	if o.Device == DeviceCUDA {
		if err := s.runGPU(ctx, targets, rep); err != nil {
			return nil, err
		}
	} else {
		for i, tg := range targets {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			o.progress("validate: layer %s (%d of %d)", tg.label(), i+1, len(targets))
			rows, err := s.checkLayer(ctx, tg)
			if err != nil {
				return nil, err
			}
			rep.Rows = append(rep.Rows, rows...)
		}
	}
	s.meter.finishLayers()
	if n := s.requantNote(rep.Rows); n != "" {
		rep.Notes = append(rep.Notes, n)
	}
	if withBytes {
		if err := s.checkBytes(ctx, rep); err != nil {
			return nil, err
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}
