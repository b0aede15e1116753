package torchbin

import "github.com/moeprep/moeprep/safetensors"

// storageDTypes maps the legacy typed-storage class names that torch.save
// writes into data.pkl (module "torch") to safetensors dtypes. Complex and
// quantised storages are deliberately absent: a state dict holding them
// cannot be expressed in safetensors and is refused by name.
var storageDTypes = map[string]safetensors.DType{
	"DoubleStorage":        safetensors.F64,
	"FloatStorage":         safetensors.F32,
	"HalfStorage":          safetensors.F16,
	"BFloat16Storage":      safetensors.BF16,
	"LongStorage":          safetensors.I64,
	"IntStorage":           safetensors.I32,
	"ShortStorage":         safetensors.I16,
	"CharStorage":          safetensors.I8,
	"ByteStorage":          safetensors.U8,
	"BoolStorage":          safetensors.BOOL,
	"Float8_e4m3fnStorage": safetensors.F8E4M3,
	"Float8_e5m2Storage":   safetensors.F8E5M2,
}

// torchDTypes maps torch dtype objects (pickled as the global torch.<name>)
// to safetensors dtypes. torch >= 2.1 saves float8 and the unsigned 16/32/64
// bit dtypes through _rebuild_tensor_v3, which names the dtype explicitly
// next to an untyped storage.
var torchDTypes = map[string]safetensors.DType{
	"float64":        safetensors.F64,
	"double":         safetensors.F64,
	"float32":        safetensors.F32,
	"float":          safetensors.F32,
	"float16":        safetensors.F16,
	"half":           safetensors.F16,
	"bfloat16":       safetensors.BF16,
	"int64":          safetensors.I64,
	"long":           safetensors.I64,
	"int32":          safetensors.I32,
	"int":            safetensors.I32,
	"int16":          safetensors.I16,
	"short":          safetensors.I16,
	"int8":           safetensors.I8,
	"uint8":          safetensors.U8,
	"uint16":         safetensors.U16,
	"uint32":         safetensors.U32,
	"uint64":         safetensors.U64,
	"bool":           safetensors.BOOL,
	"float8_e4m3fn":  safetensors.F8E4M3,
	"float8_e5m2":    safetensors.F8E5M2,
	"float8_e8m0fnu": safetensors.F8E8M0,
}
