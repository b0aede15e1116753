// How a DST that is not what SRC and its contract say ends a run: as a failed check (exit 1), named by
// the byte proof where it can.

package validate

import (
	"context"
	"fmt"
	"time"

	"github.com/moeprep/moeprep/internal/exitcode"
)

// notFromSrc answers a DST whose model differs from SRC's (sameModel's
// err), or whose contract does not fit its layers: the layer checks cannot
// pair its layers with SRC's, but the byte proof can say which file and key
// differ (a forged contract, a changed config), as the failed check it is
// (exit 1). Where the proof is skipped, cannot finish or finds nothing, err
// itself ends the run, as a failed check too: DST is not what SRC and its
// contract say, whatever else could be read.
func (s *session) notFromSrc(ctx context.Context, err error, start time.Time) (*Report, error) {
	if s.o.Bytes == BytesOff {
		return nil, misfit(err)
	}
	rep := s.bytesReport()
	s.planBytesOnly()
	if berr := s.checkBytes(ctx, rep); berr != nil {
		if ctx.Err() != nil {
			return nil, berr // interrupted: exit 130, not a verdict
		}
		return nil, misfit(err)
	}
	if rep.Bytes.Pass {
		return nil, misfit(err)
	}
	if s.o.Bytes != BytesOnly {
		rep.Notes = append(rep.Notes, "layer checks not run: "+err.Error())
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// misfit marks err, a way DST fails to be what SRC and its contract say,
// as the failed check it is (exit 1), not input validate cannot read
// (exit 2): a CI gate must count such a DST as rejected.
func misfit(err error) error {
	if exitcode.IsCheckFailure(err) {
		return err
	}
	return exitcode.Check(err.Error())
}

// stacksFit checks, before any layer runs, that DST holds the stacks its
// contract names for each target, of the contract's bank size (their
// headers alone): a forged layout or shared replica count would otherwise
// stop the layer checks as if DST could not be read, before the byte proof
// could say what differs.
func (s *session) stacksFit(targets []target) error {
	for _, tg := range targets {
		if tg.fused == nil {
			continue
		}
		if _, _, err := tg.fused.StackDims(s.dst); err != nil {
			return misfit(fmt.Errorf("%s: %w", s.o.Dst, err))
		}
	}
	return nil
}
