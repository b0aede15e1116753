package torchbin

import (
	"errors"
	"fmt"

	"github.com/moeprep/moeprep/safetensors"
)

// errRefusedClass marks a pickle global outside the allowlist.
var errRefusedClass = errors.New("refusing to load class")

// findClass is the unpickler's only way to obtain callables. It returns
// inert Go values for what a plain state dict needs and refuses everything
// else, so no pickle can reach os.system, builtins.eval and the like (the
// Go side never executes Python anyway, but an unknown class would mean
// this file is not a plain state dict). gopickle itself answers
// collections.OrderedDict, __builtin__.object and copy_reg._reconstructor
// before asking here; those are inert too.
func findClass(module, name string) (any, error) {
	switch module {
	case "torch._utils":
		switch name {
		case "_rebuild_tensor_v2":
			return &rebuildTensor{version: 2}, nil
		case "_rebuild_tensor_v3":
			return &rebuildTensor{version: 3}, nil
		case "_rebuild_parameter":
			return &rebuildParameter{withState: false}, nil
		case "_rebuild_parameter_with_state":
			return &rebuildParameter{withState: true}, nil
		}
	case "torch":
		if dt, ok := storageDTypes[name]; ok {
			return &storageClass{name: name, dtype: dt}, nil
		}
		if name == "UntypedStorage" {
			return &storageClass{name: name}, nil
		}
		if dt, ok := torchDTypes[name]; ok {
			return &torchDType{name: name, dtype: dt}, nil
		}
	case "torch.storage":
		if name == "UntypedStorage" {
			return &storageClass{name: name}, nil
		}
	}
	return nil, fmt.Errorf("%w %s.%s (not in the allowlist for state dicts)", errRefusedClass, module, name)
}

// storageClass is a torch.*Storage class named in a persistent id. An
// untyped storage (torch >= 2.1 for float8 and unsigned dtypes) has an empty
// dtype: the tensor's rebuild call names it.
type storageClass struct {
	name  string
	dtype safetensors.DType
}

// torchDType is a torch dtype object such as torch.float8_e4m3fn.
type torchDType struct {
	name  string
	dtype safetensors.DType
}

// storageRef is what persistent_load yields for ('storage', class, key,
// location, numel): the archive entry data/<key>, not its bytes.
type storageRef struct {
	key    string
	class  *storageClass
	nbytes int64 // size of the zip entry
	offset int64 // absolute file offset of the entry's data
}

// tensorView is a rebuilt tensor: a strided view into one storage.
type tensorView struct {
	storage *storageRef
	dtype   safetensors.DType
	offset  int64 // in elements
	shape   []int64
	stride  []int64
}

// maxRank bounds tensor dimensions; torch itself stops well below it.
const maxRank = 64

// rebuildTensor mirrors torch._utils._rebuild_tensor_v2(storage,
// storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
// and _rebuild_tensor_v3(..., backward_hooks, dtype[, metadata]).
type rebuildTensor struct{ version int }

func (r *rebuildTensor) Call(args ...any) (any, error) {
	name := fmt.Sprintf("_rebuild_tensor_v%d", r.version)
	min := 6
	if r.version == 3 {
		min = 7
	}
	if len(args) < min || len(args) > min+1 {
		return nil, fmt.Errorf("%s: got %d arguments, want %d or %d", name, len(args), min, min+1)
	}
	st, ok := args[0].(*storageRef)
	if !ok {
		return nil, fmt.Errorf("%s: first argument is %s, not a storage", name, pyType(args[0]))
	}
	dtype := st.class.dtype
	if r.version == 3 {
		dt, ok := args[6].(*torchDType)
		if !ok {
			return nil, fmt.Errorf("%s: dtype argument is %s, not a torch dtype", name, pyType(args[6]))
		}
		if dtype != "" && dtype != dt.dtype {
			return nil, fmt.Errorf("%s: storage %s holds %s, dtype argument says %s", name, st.class.name, dtype, dt.dtype)
		}
		dtype = dt.dtype
	}
	if dtype == "" {
		return nil, fmt.Errorf("%s: untyped storage %q without a dtype", name, st.key)
	}
	offset, ok := asInt64(args[1])
	if !ok || offset < 0 {
		return nil, fmt.Errorf("%s: storage offset is %s, not a non-negative int", name, pyType(args[1]))
	}
	shape, err := intTuple(args[2], "size")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	stride, err := intTuple(args[3], "stride")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(shape) > maxRank {
		return nil, fmt.Errorf("%s: tensor of %d dims, at most %d supported", name, len(shape), maxRank)
	}
	if len(shape) != len(stride) {
		return nil, fmt.Errorf("%s: size has %d dims, stride has %d", name, len(shape), len(stride))
	}
	return &tensorView{storage: st, dtype: dtype, offset: offset, shape: shape, stride: stride}, nil
}

// rebuildParameter mirrors torch._utils._rebuild_parameter(data,
// requires_grad, backward_hooks) and _rebuild_parameter_with_state(...,
// state): an nn.Parameter is its data tensor for our purposes.
type rebuildParameter struct{ withState bool }

func (r *rebuildParameter) Call(args ...any) (any, error) {
	want := 3
	if r.withState {
		want = 4
	}
	if len(args) != want {
		return nil, fmt.Errorf("_rebuild_parameter: got %d arguments, want %d", len(args), want)
	}
	t, ok := args[0].(*tensorView)
	if !ok {
		return nil, fmt.Errorf("_rebuild_parameter: data is %s, not a tensor", pyType(args[0]))
	}
	return t, nil
}

// intTuple converts a pickled tuple of Python ints (sizes, strides).
func intTuple(v any, what string) ([]int64, error) {
	items, ok := tupleItems(v)
	if !ok {
		return nil, fmt.Errorf("%s is %s, not a tuple", what, pyType(v))
	}
	out := make([]int64, len(items))
	for i, it := range items {
		n, ok := asInt64(it)
		if !ok || n < 0 {
			return nil, fmt.Errorf("%s[%d] is %s, not a non-negative int", what, i, pyValue(it))
		}
		out[i] = n
	}
	return out, nil
}
