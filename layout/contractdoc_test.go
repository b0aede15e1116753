package layout

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestContractFieldsDocumented: every key the contract writes in
// config.json, nested objects' keys included, is named in CONTRACT.md
// (as `key`), so a field added to Contract without its documentation
// fails here.
func TestContractFieldsDocumented(t *testing.T) {
	doc, err := os.ReadFile("CONTRACT.md")
	if err != nil {
		t.Fatal(err)
	}
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
