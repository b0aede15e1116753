package termsafe

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestEscape(t *testing.T) {
	cases := []struct{ in, line, text string }{
		{"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.gate.weight", "model.layers.0.mlp.gate.weight"},
		{"a\x1b[2K\rPASS", `a\x1b[2K\x0dPASS`, `a\x1b[2K\x0dPASS`},
		{"two\nlines\tx", `two\x0alines\x09x`, "two\nlines\tx"},
		{"del\x7f", `del\u007f`, `del\u007f`},
		{"c1\u009b31m", `c1\u009b31m`, `c1\u009b31m`},
		{"bad\xff\xfe", `bad\xff\xfe`, `bad\xff\xfe`},
		{"ünïcödé 专家", "ünïcödé 专家", "ünïcödé 专家"},
	}
	for _, c := range cases {
		if got := Escape(c.in); got != c.line {
			t.Errorf("Escape(%q) = %q, want %q", c.in, got, c.line)
		}
		if got := Text(c.in); got != c.text {
			t.Errorf("Text(%q) = %q, want %q", c.in, got, c.text)
		}
	}
}

func TestWriterSplitRunes(t *testing.T) {
	in := []byte("专家\x1b[31mred\u009b\n")
	want := Text(string(in))
	// Every split point must give the same output.
	for cut := 0; cut <= len(in); cut++ {
		var out bytes.Buffer
		w := NewWriter(&out)
		if n, err := w.Write(in[:cut]); err != nil || n != cut {
			t.Fatalf("cut %d: %d, %v", cut, n, err)
		}
		w.Write(in[cut:])
		w.Flush()
		if out.String() != want {
			t.Errorf("cut %d: %q, want %q", cut, out.String(), want)
		}
	}
}

// JSON written through a Writer still decodes to the same values.
func TestWriterKeepsJSON(t *testing.T) {
	v := map[string]string{"name": "x\x1b[2K\u009b\x7fy\n专家"}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	w := NewWriter(&out)
	w.Write(b)
	w.Flush()
	if bytes.ContainsAny(out.Bytes(), "\x1b\x7f") || bytes.Contains(out.Bytes(), []byte("\u009b")) {
		t.Fatalf("raw control left: %q", out.String())
	}
	var back map[string]string
	if err := json.Unmarshal(out.Bytes(), &back); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	if back["name"] != v["name"] {
		t.Fatalf("decoded %q, want %q", back["name"], v["name"])
	}
}
