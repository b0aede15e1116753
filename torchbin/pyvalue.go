package torchbin

import (
	"fmt"
	"math"
	"math/big"

	"github.com/nlpodyssey/gopickle/types"
)

// asInt64 accepts a Python int (gopickle yields int, or *big.Int beyond
// 64 bits) that fits in int64. bool is not an int here.
func asInt64(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case *big.Int:
		if n != nil && n.IsInt64() {
			return n.Int64(), true
		}
	}
	return 0, false
}

func tupleItems(v any) ([]any, bool) {
	t, ok := v.(*types.Tuple)
	if !ok || t == nil {
		return nil, false
	}
	return []any(*t), true
}

// pyType names the Python type of a gopickle value for error messages. It
// never descends into containers, which may be cyclic.
func pyType(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case *types.ByteArray:
		return "bytearray"
	case *types.Tuple:
		return "tuple"
	case *types.List:
		return "list"
	case *types.Dict:
		return "dict"
	case *types.OrderedDict:
		return "OrderedDict"
	case *types.Set:
		return "set"
	case *types.FrozenSet:
		return "frozenset"
	case *tensorView:
		return "tensor"
	case *storageRef:
		return "storage"
	case *storageClass:
		return "class torch." + x.name
	case *torchDType:
		return "torch." + x.name
	case *rebuildTensor:
		return fmt.Sprintf("function _rebuild_tensor_v%d", x.version)
	case *rebuildParameter:
		return "function _rebuild_parameter"
	case *types.OrderedDictClass:
		return "class collections.OrderedDict"
	case *types.ObjectClass:
		return "class object"
	case *types.Reconstructor:
		return "function copy_reg._reconstructor"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// pyValue shows small scalars and the type of anything else.
func pyValue(v any) string {
	switch x := v.(type) {
	case int:
		return fmt.Sprintf("%d", x)
	case *big.Int:
		if x != nil && x.BitLen() <= 128 {
			return x.String()
		}
	case bool:
		if x {
			return "True"
		}
		return "False"
	case float64:
		if !math.IsNaN(x) {
			return fmt.Sprintf("%g", x)
		}
	case string:
		if len(x) <= 64 {
			return fmt.Sprintf("%q", x)
		}
	}
	return pyType(v)
}

// isScalar reports whether v is a plain Python scalar, the only kind of
// non-tensor value a state dict may carry without being refused.
func isScalar(v any) bool {
	switch v.(type) {
	case nil, bool, int, *big.Int, float64, string:
		return true
	}
	return false
}
