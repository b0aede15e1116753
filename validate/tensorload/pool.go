package tensorload

import "sync"

// Expert weights are decoded into large buffers (59 MB of float32 per
// DeepSeek-V3 projection); allocating them fresh makes the runtime zero each
// one, which cost about a sixth of a validate run. These pools recycle them:
// every user overwrites the whole buffer, so nothing needs zeroing.
var (
	bytePool  = pool[byte]{keep: 1 << 20}
	floatPool = pool[float32]{keep: 1 << 18}
)

// pool recycles buffers of at least keep elements.
type pool[T any] struct {
	p    sync.Pool // *[]T
	keep int
}

func (p *pool[T]) get(n int) []T {
	if b, ok := p.p.Get().(*[]T); ok && cap(*b) >= n {
		return (*b)[:n]
	}
	return make([]T, n)
}

func (p *pool[T]) put(b []T) {
	if cap(b) >= p.keep {
		p.p.Put(&b)
	}
}

func getBytes(n int) []byte     { return bytePool.get(n) }
func putBytes(b []byte)         { bytePool.put(b) }
func getFloats(n int) []float32 { return floatPool.get(n) }

// PutFloats hands a buffer back for reuse.
func PutFloats(f []float32) { floatPool.put(f) }
