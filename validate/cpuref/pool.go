package cpuref

import "sync"

// Expert weights are decoded into large buffers (59 MB of float32 per
// DeepSeek-V3 projection); allocating them fresh makes the runtime zero each
// one, which cost about a sixth of a validate run. These pools recycle them:
// every user overwrites the whole buffer, so nothing needs zeroing.
var (
	bytePool  sync.Pool // *[]byte
	floatPool sync.Pool // *[]float32
)

func getBytes(n int) []byte {
	if p, ok := bytePool.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func putBytes(b []byte) {
	if cap(b) >= 1<<20 {
		bytePool.Put(&b)
	}
}

func getFloats(n int) []float32 {
	if p, ok := floatPool.Get().(*[]float32); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]float32, n)
}

func PutFloats(f []float32) {
	if cap(f) >= 1<<18 {
		floatPool.Put(&f)
	}
}
