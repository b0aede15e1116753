package family

import "github.com/moeprep/moeprep/internal/jsoncfg"

// maxDim bounds every size read from config.json, so that products of two
// sizes (S*I, shape checks) cannot overflow.
const maxDim = jsoncfg.MaxDim

// Limits on the config.json numbers that size what moeprep builds or loops
// over: a plan holds every MoE layer's expert names, and the commands
// allocate by these sizes (tokens x hidden_size activations, routing tables
// of a layer's experts). A sparse file can back a tensor of any shape, so
// agreeing with the tensors is not enough. Each is far above any released
// model and keeps a hostile config.json to a one-line error instead of
// gigabytes, or the Go runtime running out of memory.
const (
	// maxLayers: the deepest released models have about 130 decoder
	// layers (Llama-3.1-405B 126, Qwen3-235B-A22B 94, DeepSeek-V3 61).
	maxLayers = 1 << 12
	// maxExperts: Qwen3-Next routes over 512 experts, Kimi-K2 384,
	// DeepSeek-V3 256.
	maxExperts = 1 << 14
	// maxSharedExperts: released models have one to eight.
	maxSharedExperts = 1 << 10
	// maxExpertSlots bounds the experts a plan holds over all its MoE
	// layers: Qwen3-Next's 48 x 512 and Kimi-K2's 60 x 384 are about
	// 24,000; each costs a few hundred bytes of names.
	maxExpertSlots = 1 << 18
	// MaxHidden: the widest released models have hidden_size 16,384
	// (Llama-3.1-405B); DeepSeek-V3 and Kimi-K2 7,168. Exported: a
	// golden's H, where its layer's is not given, is bounded so too.
	MaxHidden = 1 << 16
	// maxIntermediate bounds expert and shared MLP widths: Mixtral's
	// experts are 14,336 wide, the widest dense MLPs 53,248.
	maxIntermediate = 1 << 18
	// maxVocab bounds a hash-routing table's rows: vocabularies run to
	// about 256,000 (DeepSeek-V4 129,280).
	maxVocab = 1 << 22
	// maxConfigList bounds the layer lists (mlp_layer_types, moe_layers,
	// mlp_only_layers), which have one entry a layer at most: every list
	// jsoncfg reads.
	maxConfigList = jsoncfg.MaxList
)

// config is one JSON object of config.json; at is the path of the object
// itself ("" or "quantization_config."). Its short methods are jsoncfg's
// reads (each checks the value's type and names the key in full), one
// implementation shared with quantdesc, kept short so the families' data
// files stay terse.
type config struct {
	m  map[string]any
	at string
}

func (c config) j() jsoncfg.Object { return jsoncfg.Object{M: c.m, At: c.at} }

func configOf(o jsoncfg.Object) config { return config{m: o.M, at: o.At} }

func (c config) get(key string) (any, bool) { return c.j().Get(key) }
func (c config) has(key string) bool        { return c.j().Has(key) }
func (c config) errorf(key, format string, args ...any) error {
	return c.j().Errorf(key, format, args...)
}
func (c config) missing(key string) error { return c.j().Missing(key) }
func (c config) intIn(key string, def, lo, hi int64) (int, error) {
	return c.j().IntIn(key, def, lo, hi)
}
func (c config) size(key string) (int, error) { return c.j().Size(key) }
func (c config) sizeAtMost(key string, hi int, what string) (int, error) {
	return c.j().SizeAtMost(key, hi, what)
}
func (c config) count(key string, def int) (int, error)         { return c.j().Count(key, def) }
func (c config) float(key string, def float64) (float64, error) { return c.j().Float(key, def) }
func (c config) boolean(key string, def bool) (bool, error)     { return c.j().Bool(key, def) }
func (c config) str(key, def string) (string, error)            { return c.j().Str(key, def) }
func (c config) ints(key string) ([]int, error)                 { return c.j().Ints(key) }
func (c config) strs(key string) ([]string, error)              { return c.j().Strs(key) }
func (c config) object(key string) (config, bool, error) {
	o, ok, err := c.j().Object(key)
	return configOf(o), ok, err
}

// describe names a JSON value the way an error message should show it.
func describe(v any) string { return jsoncfg.Describe(v) }

// asInt converts an integral JSON number (jsoncfg.AsInt).
func asInt(v any) (int64, bool) { return jsoncfg.AsInt(v) }
