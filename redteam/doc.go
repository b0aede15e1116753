// Package redteam is the red-team suite: hostile and tampered
// checkpoints, generated at test time, run through the real moeprep binary
// as a subprocess.
//
// Everything is in the _test.go files; this package has no code of its own.
// The tests build cmd/moeprep once (TestMain), then run every case in a
// child process with its own timeout, because the properties under test are
// properties of the process, not of a library call: the exit code, the one
// line on stderr, what is left on disk, how long it ran and its peak RSS. An
// in-process test could not see a runaway allocation (it would take the test
// binary down with it) nor a run that never ends.
//
// Each case asserts, as the README promises for any input however broken:
//
//   - the exit code (0, 1 for a failed check, 2 for unusable input, 130
//     when interrupted);
//   - stderr ends in exactly one line starting "moeprep: " that names the
//     offending file, and no panic or stack trace text anywhere;
//   - no raw ESC byte on stdout or stderr;
//   - nothing left behind that looks complete: a failed convert creates no
//     DST (DST.partial only where documented: after an interruption);
//   - wall time under maxWall and peak RSS under maxRSSBytes (the issue's
//     "Done when" bounds).
//
// The themes are one file each: data loss (dataloss_test.go), silently wrong
// output after a resume or a concurrent run (stale_test.go), validate
// certifying tampered outputs (tamper_test.go), hostile inputs
// (hostile_test.go), terminal injection (terminal_test.go) and hub-cache
// snapshots made of symbolic links (snapshot_test.go).
//
// Run it with `go test ./redteam/`: about 30 s on 2 cores when every case
// passes (a case that hangs costs its 10 s timeout). REDTEAM_MOEPREP=PATH
// runs the cases against a binary built elsewhere instead, e.g. an older
// revision's, to see which cases it fails.
package redteam
