// Reflection helpers that put a struct difference into the words of a config key, for errors a person
// reads.

package validate

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"unicode"
)

// fieldDiff names the fields in which two values of one struct type differ,
// "scoring sigmoid (SRC softmax), top_k 4 (SRC 2)", for an error a person
// reads (a %+v dump of the whole struct hides the one field that matters).
func fieldDiff(dst, src any) string {
	dv, sv := reflect.ValueOf(dst), reflect.ValueOf(src)
	if dv.Kind() != reflect.Struct || dv.Type() != sv.Type() {
		return fmt.Sprintf("%v (SRC %v)", dst, src)
	}
	var out []string
	for i := range dv.NumField() {
		a, b := dv.Field(i), sv.Field(i)
		if !dv.Type().Field(i).IsExported() || reflect.DeepEqual(a.Interface(), b.Interface()) {
			continue
		}
		out = append(out, fmt.Sprintf("%s %v (SRC %v)", snakeCase(dv.Type().Field(i).Name), a.Interface(), b.Interface()))
	}
	return strings.Join(out, ", ")
}

// snakeCase turns a Go field name into the words of a config key:
// NumExperts -> num_experts, TopKGroup -> top_k_group.
func snakeCase(name string) string {
	var b strings.Builder
	for i, r := range name {
		if unicode.IsUpper(r) {
			if i > 0 && (!unicode.IsUpper(rune(name[i-1])) || i+1 < len(name) && unicode.IsLower(rune(name[i+1]))) {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// jsonText is v as compact JSON, for values with no better words.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
