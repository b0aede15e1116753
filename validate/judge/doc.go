// Package judge is how validate decides: the metrics that compare an output
// with its reference (relative L2, max abs, cosine, tie-robust top-k and
// routing-weight agreement), the tolerances with the measurements that set
// them, and the one table of checks a report row can hold: what each
// compares, which tolerance applies for the numerics that ran, and how it
// is judged.
//
// It imports nothing of validate's, so the root (which runs the paths and
// writes the report) and any sub-package can look a check up in the table
// instead of keeping its name, threshold and meaning apart. A new check is
// one row in checks.go, the code that emits it, and its name in
// validate/SCHEMA.md; TestChecksDocumented and the root's
// TestEveryEmittedCheckHasARow hold the table to both.
package judge
