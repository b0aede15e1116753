package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// Text from a checkpoint (a model_type, a tensor name) cannot steer the
// terminal: a crafted one would erase the error line and paint a PASS.
func TestNamesFromFilesAreEscaped(t *testing.T) {
	const evil = "\x1b[2K\x1b[1A\rall checks PASS\u009b"
	cases := []struct {
		name   string
		dir    string // under the test's temporary directory
		config string
		tensor string
		want   string // the escaped text stderr must show
	}{
		// quoted where the message is made
		{"model_type", "ck", `{"model_type": "` + jsonEscape(evil) + `"}`, "w", `\x1b[2K\x1b[1A\rall checks PASS\u009b`},
		// printed as it is where the message is made: escaped on the way out
		{"path", "ck" + evil, `{"model_type": "mixtral"}`, "w", `ck\x1b[2K\x1b[1A all checks PASS\u009b`}, // \r is white space to the one-line rule
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), tc.dir)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			testkit.WriteFile(t, filepath.Join(dir, "config.json"), []byte(tc.config))
			writeOneTensor(t, filepath.Join(dir, "model.safetensors"), tc.tensor)
			code, stdout, stderr := runCLI(t, "inspect", dir)
			if code != 2 {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			assertCleanError(t, stderr)
			for _, s := range []string{stdout, stderr} {
				if strings.ContainsAny(s, "\x1b\r") || strings.Contains(s, "\u009b") {
					t.Errorf("raw control characters printed: %q", s)
				}
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q does not show %q", stderr, tc.want)
			}
		})
	}
}

func jsonEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&15])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// writeOneTensor writes a safetensors file holding one 2-byte BF16 tensor.
func writeOneTensor(t *testing.T, path, name string) {
	t.Helper()
	hdr := `{"` + jsonEscape(name) + `":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}`
	testkit.WriteFile(t, path, append(testkit.STHead(hdr), 0x80, 0x3f))
}
