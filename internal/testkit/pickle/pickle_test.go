package pickle

import (
	"archive/zip"
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestZipStreams(t *testing.T) {
	var buf bytes.Buffer
	storages := map[string][]byte{"10": {1}, "2": {2}, "zero": {0}}
	if err := Zip(&buf, "archive", Stream(Proto2, Repeat("}0", 100_000), []any{"}", []byte(".")}), storages); err != nil {
		t.Fatal(err)
	}
	zr, err := zip.NewReader(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	if got := strings.Join(names, " "); got != "archive/data.pkl archive/byteorder archive/data/2 archive/data/10 archive/data/zero archive/version" {
		t.Errorf("entries %s", got)
	}
	r, err := zr.File[0].Open()
	if err != nil {
		t.Fatal(err)
	}
	pkl, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := Proto2 + strings.Repeat("}0", 100_000) + "}."; string(pkl) != want {
		t.Errorf("data.pkl of %d bytes, want %d", len(pkl), len(want))
	}
}

func TestInts(t *testing.T) {
	for n, want := range map[int64]string{
		1:       "J\x01\x00\x00\x00",
		-1:      "J\xff\xff\xff\xff",
		1 << 31: "\x8a\x08\x00\x00\x00\x80\x00\x00\x00\x00",
	} {
		if got := Int(n); got != want {
			t.Errorf("Int(%d) = %q, want %q", n, got, want)
		}
	}
	if got := SmallInts(1, 2); got != "(K\x01K\x02t" {
		t.Errorf("SmallInts: %q", got)
	}
}
