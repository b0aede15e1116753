// Package cktest opens checkpoints for tests through moeprep's own reader
// and planner, and writes synth's presets: testkit's helpers that need them. Tests of checkpoint, of
// family and of what they import cannot use it (an import cycle); the
// rest (convert, validate, fixtures, cmd) can. Only tests import it.
package cktest

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/moeprep/moeprep/checkpoint"
	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/fixtures"
	"github.com/moeprep/moeprep/internal/testkit"
	"github.com/moeprep/moeprep/safetensors"
)

// Open opens the checkpoint in dir; it is closed when the test ends.
func Open(t testing.TB, dir string) *checkpoint.Checkpoint {
	t.Helper()
	ck, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck
}

// OpenPlanned opens and plans the checkpoint in dir; it is closed when the
// test ends.
func OpenPlanned(t testing.TB, dir string) (*checkpoint.Checkpoint, *family.Plan) {
	t.Helper()
	ck := Open(t, dir)
	p, err := ck.Plan()
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	return ck, p
}

// Plan plans the checkpoint in dir.
func Plan(t testing.TB, dir string) *family.Plan {
	t.Helper()
	_, p := OpenPlanned(t, dir)
	return p
}

// Mem is an in-memory checkpoint: its tensors by name, a TensorSource.
type Mem map[string]*checkpoint.Tensor

// Tensor is tensor name.
func (m Mem) Tensor(name string) (*checkpoint.Tensor, bool) { t, ok := m[name]; return t, ok }

// Put makes b tensor name.
func (m Mem) Put(name string, dt safetensors.DType, shape []int64, b []byte) {
	m[name] = &checkpoint.Tensor{Name: name, DType: dt, Shape: shape, File: "mem", Data: bytes.NewReader(b)}
}

// PutF32 makes v, as little-endian float32s, tensor name of shape.
func (m Mem) PutF32(name string, shape []int64, v ...float32) {
	m.Put(name, safetensors.F32, shape, testkit.F32LE(v...))
}

// Bytes is tensor name's bytes; it panics when there is none.
func (m Mem) Bytes(name string) []byte {
	b, err := m[name].ReadAll()
	if err != nil {
		panic(err)
	}
	return b
}

// Source is anything tests read tensors from by name: a *checkpoint.Checkpoint,
// a Mem, validate's tensor sources.
type Source interface {
	Tensor(name string) (*checkpoint.Tensor, bool)
}

// ReadAll is tn's bytes; a read error fails t.
func ReadAll(t testing.TB, tn *checkpoint.Tensor) []byte {
	t.Helper()
	b, err := tn.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Bytes is tensor name's bytes in src; a missing tensor or a read error
// fails t.
func Bytes(t testing.TB, src Source, name string) []byte {
	t.Helper()
	tn, ok := src.Tensor(name)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	return ReadAll(t, tn)
}

// Preset is synth preset name's spec.
func Preset(t testing.TB, name string) fixtures.SynthSpec {
	t.Helper()
	spec, err := fixtures.Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// WriteSpec writes spec into dir with synth's default options and returns dir.
func WriteSpec(t testing.TB, dir string, spec fixtures.SynthSpec) string {
	t.Helper()
	if _, err := fixtures.Write(context.Background(), dir, spec, fixtures.Options{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// WritePreset writes synth preset name into a temporary directory of that
// name and returns it.
func WritePreset(t testing.TB, name string) string {
	t.Helper()
	return WriteSpec(t, filepath.Join(t.TempDir(), name), Preset(t, name))
}
