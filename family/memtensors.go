package family

import (
	"slices"

	"github.com/moeprep/moeprep/safetensors"
)

// MemTensors is a Tensors held in memory: names in the order first added,
// each with its metadata. The planners' tests, and those of packages that
// read what a checkpoint holds through Tensors (quantweights), describe a
// checkpoint with it without writing a file. The zero value is empty and
// ready to use.
type MemTensors struct {
	names []string
	meta  map[string]TensorMeta
}

// Add sets name's dtype and shape; a name not yet held goes last in Names.
func (m *MemTensors) Add(name string, dt safetensors.DType, shape ...int64) {
	if m.meta == nil {
		m.meta = map[string]TensorMeta{}
	}
	if _, ok := m.meta[name]; !ok {
		m.names = append(m.names, name)
	}
	m.meta[name] = TensorMeta{DType: dt, Shape: shape}
}

// Delete removes name, saying whether it was held.
func (m *MemTensors) Delete(name string) bool {
	if _, ok := m.meta[name]; !ok {
		return false
	}
	delete(m.meta, name)
	m.names = slices.DeleteFunc(m.names, func(n string) bool { return n == name })
	return true
}

func (m *MemTensors) Lookup(name string) (TensorMeta, bool) {
	t, ok := m.meta[name]
	return t, ok
}

func (m *MemTensors) Names() []string { return m.names }
