//go:build !unix

package convert

import "os"

// lockDir: no flock here; two runs on one DST are not kept apart.
func lockDir(*os.File) (bool, error) { return false, nil }
