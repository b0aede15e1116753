package layout

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/moeprep/moeprep/internal/testkit"
)

// TestContractFieldsDocumented: every key the contract writes in
// config.json, nested objects' keys included, is named in CONTRACT.md
// (as `key`), so a field added to Contract without its documentation
// fails here.
func TestContractFieldsDocumented(t *testing.T) {
	doc := testkit.ReadFile(t, "CONTRACT.md")
	seen := map[reflect.Type]bool{}
	var walk func(ty reflect.Type, path string)
	walk = func(ty reflect.Type, path string) {
		for ty.Kind() == reflect.Pointer || ty.Kind() == reflect.Slice || ty.Kind() == reflect.Array {
			ty = ty.Elem()
		}
		if ty.Kind() != reflect.Struct || seen[ty] {
			return
		}
		seen[ty] = true
		for i := range ty.NumField() {
			f := ty.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if key == "" || key == "-" {
				continue
			}
			if !strings.Contains(string(doc), "`"+key+"`") {
				t.Errorf("CONTRACT.md does not document the contract's %s%s", path, key)
			}
			walk(f.Type, path+key+".")
		}
	}
	walk(reflect.TypeOf(Contract{}), "")
	if len(seen) < 4 {
		t.Fatalf("walked %d object types, want Contract, LayerInfo, Activation and Requantization", len(seen))
	}
}

// The shell recipes CONTRACT.md gives for checking a shard's block digest
// by hand must compute what moeprep computes, with the block size moeprep
// writes. Each runs here on a random file of several blocks. CI installs
// the tools (.ci/run); elsewhere a missing tool skips its recipe.
func TestContractRecipes(t *testing.T) {
	doc := testkit.ReadFile(t, "CONTRACT.md")
	recipes := regexp.MustCompile("`(split -a 6 -d -b (\\d+) SHARD blk\\. && [^`]+)`").FindAllStringSubmatch(string(doc), -1)
	algos := []struct {
		algo BlockAlgo
		tool string
	}{{XXH3Blocks, "xxhsum"}, {BLAKE3Blocks, "b3sum"}, {SHA256Blocks, "sha256sum"}}
	if len(recipes) != len(algos) {
		t.Fatalf("CONTRACT.md has %d hand recipes, want one per digest (%d)", len(recipes), len(algos))
	}
	dir := t.TempDir()
	shard := filepath.Join(dir, "model-00001-of-00001.safetensors")
	b := make([]byte, 2*ShardBlockSize+12345) // two whole blocks and a short one
	r := rand.New(rand.NewPCG(7, 9))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	testkit.WriteFile(t, shard, b)
	for i, a := range algos {
		recipe, bs := recipes[i][1], recipes[i][2]
		t.Run(a.algo.String(), func(t *testing.T) {
			if n, _ := strconv.Atoi(bs); n != ShardBlockSize {
				t.Fatalf("the recipe splits into %s-byte blocks, moeprep writes %d", bs, ShardBlockSize)
			}
			if !strings.Contains(recipe, a.tool) {
				t.Fatalf("recipe %d does not use %s: %s", i, a.tool, recipe)
			}
			for _, tool := range []string{a.tool, "split", "xxd", "bash"} {
				if _, err := exec.LookPath(tool); err != nil {
					if os.Getenv("CI") != "" {
						t.Fatalf("%s is not installed: .ci/run must install it", tool)
					}
					t.Skipf("%s is not installed", tool)
				}
			}
			work := t.TempDir()
			cmd := exec.Command("bash", "-c", strings.ReplaceAll(recipe, "SHARD", shard))
			cmd.Dir = work
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v: %s", recipe, err, out)
			}
			got := strings.Fields(string(out))[0]
			want := NewHasher(BlockInfo(a.algo, 0, ShardBlockSize, nil))
			want.Write(b)
			fi := want.Sum()
			d, _, _ := fi.blocks()
			if got != d.Root {
				t.Errorf("the recipe gives %s, moeprep %s", got, d.Root)
			}
		})
	}
}
