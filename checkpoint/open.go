package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/moeprep/moeprep/layout"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/moeprep/moeprep/family"
	"github.com/moeprep/moeprep/internal/safeio"
	"github.com/moeprep/moeprep/quantdesc"
	"github.com/moeprep/moeprep/safetensors"
	"github.com/moeprep/moeprep/torchbin"
	"github.com/moeprep/moeprep/weightfmt"
)

// Formats a checkpoint's weights can come in.
const (
	FormatSafetensors = "safetensors"
	FormatTorch       = "torch"
)

// ConfigFileName is the hub config every checkpoint directory must hold.
const ConfigFileName = "config.json"

// maxConfigBytes bounds config.json: real ones are a few KB.
const maxConfigBytes = 16 << 20

// MaxTensors bounds the tensors of one checkpoint, over all its files.
// Kimi-K2 stored as INT4 (three tensors a projection, 61 layers of 384
// experts) has about 211,000, the most of any checkpoint we know; every
// tensor costs a few hundred bytes of bookkeeping here and in the plans
// built from it, so 1 Mi keeps a hostile checkpoint of empty tensors to a
// few hundred MB while leaving real ones five times the room they need.
const MaxTensors = 1 << 20

// maxOtherFiles bounds the files copied beside the weights (tokenizers,
// READMEs, code): real repos have tens; a directory of millions is not a
// checkpoint. maxWalkEntries bounds every entry the listing visits, so a
// tree of empty directories costs no more than one of files.
const (
	maxOtherFiles  = 100_000
	maxWalkEntries = 4 * maxOtherFiles
)

// Checkpoint is an opened hub-layout directory. Only headers and the pickle
// are in memory; tensor bytes are read through each Tensor's Data.
type Checkpoint struct {
	Dir        string
	Format     string
	Config     map[string]any
	ConfigJSON []byte
	// HFQuant is hf_quant_config.json (ModelOpt's quantisation
	// description) decoded, or nil when the directory has none.
	HFQuant     map[string]any
	Tensors     []*Tensor // in file order, files in sorted name order
	WeightFiles []string  // weight and index files, relative to Dir

	byName  map[string]*Tensor
	closers []io.Closer

	// modules memoises family's quantisation modules (QuantModules): a
	// plan asks for them once per description check, and collecting them
	// walks every tensor name.
	modulesMu sync.Mutex
	modules   map[string]*quantdesc.Modules

	small smallWindow
	// adviseOnce: the small tensors' reads were announced (adviseSmall).
	adviseOnce sync.Once
}

// smallWindow is the last stretch of a weight file SmallTensorBytes read:
// a plan reads every expert's compressed-tensors weight_shape (16 bytes,
// three an expert, 69,000 for Kimi-K2), and the ones of neighbouring
// experts lie within a few kilobytes of each other, so one read serves
// many instead of a pread each.
type smallWindow struct {
	mu  sync.Mutex
	r   io.ReaderAt // the file (a section's outer reader)
	off int64
	b   []byte
}

// smallWindowBytes is how much smallWindow reads at once.
const smallWindowBytes = 64 << 10

// read copies n bytes of r at off into a new slice when the window holds
// them, reading the window from off when it does not; ok is false when
// the file has not n bytes there (the caller reads directly and reports
// it).
func (w *smallWindow) read(r io.ReaderAt, off, n int64) ([]byte, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.r != r || off < w.off || off+n > w.off+int64(len(w.b)) {
		if w.b == nil {
			w.b = make([]byte, smallWindowBytes)
		}
		got, _ := r.ReadAt(w.b[:cap(w.b)], off)
		w.r, w.off, w.b = r, off, w.b[:got]
		if off+n > w.off+int64(len(w.b)) {
			w.r = nil
			return nil, false
		}
	}
	return slices.Clone(w.b[off-w.off : off-w.off+n]), true
}

// Open reads dir/config.json and maps every tensor of the checkpoint's weight
// files: a sharded or single safetensors checkpoint, or a sharded or single
// PyTorch zip checkpoint, in that order of preference.
func Open(dir string) (*Checkpoint, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, safeio.Unwrap(err))
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("%s: not a directory (expected a hub-layout checkpoint directory)", dir)
	}
	c := &Checkpoint{Dir: dir, byName: map[string]*Tensor{}}
	if err := c.readConfig(); err != nil {
		return nil, err
	}
	if err := c.openWeights(); err != nil {
		c.Close()
		return nil, err
	}
	c.canonicalScaleShapes()
	return c, nil
}

// canonicalScaleShapes gives every FP8 block scale stored with its size-1
// dimensions squeezed (as transformers 5 saves expert scales) the 2-D shape
// [ceil(rows/128), ceil(cols/128)] of its weight's block grid. The bytes
// are the same row-major grid, so readers and writers downstream see one
// shape; anything that is not such a squeezed grid is left for the family
// checks to refuse.
func (c *Checkpoint) canonicalScaleShapes() {
	const suffix = ".weight_scale_inv"
	for _, t := range c.Tensors {
		if !strings.HasSuffix(t.Name, suffix) {
			continue
		}
		w, ok := c.byName[strings.TrimSuffix(t.Name, suffix)+".weight"]
		if !ok || w.DType != safetensors.F8E4M3 {
			continue
		}
		if canon, ok := family.CanonicalScaleShape(w.Shape, t.Shape); ok {
			t.Shape = canon
		}
	}
	// FP8 weights scaled per channel or per tensor (weight_scale): a
	// per-tensor scale stored as a scalar [] or [1] is read as the one-entry
	// grid [1,1], a per-channel one stored as [out] as [out,1]. Copies keep
	// the file's shape (FileShape).
	for _, t := range c.Tensors {
		name, ok := strings.CutSuffix(t.Name, ".weight_scale")
		if !ok {
			continue
		}
		w, ok := c.byName[name+".weight"]
		if !ok || w.DType != safetensors.F8E4M3 {
			continue
		}
		if canon, ok := family.CanonicalScaledShape(w.Shape, t.Shape); ok {
			t.FileShape, t.Shape = t.Shape, canon
		}
	}
}

func (c *Checkpoint) readConfig() error {
	cfg, b, err := readJSONObject(filepath.Join(c.Dir, ConfigFileName))
	if err != nil {
		return err
	}
	c.Config, c.ConfigJSON = cfg, b
	return c.readHFQuantConfig()
}

// HFQuantConfigFileName is ModelOpt's quantisation description, beside
// config.json in some checkpoints.
const HFQuantConfigFileName = "hf_quant_config.json"

// readHFQuantConfig reads hf_quant_config.json when there is one.
func (c *Checkpoint) readHFQuantConfig() error {
	path := filepath.Join(c.Dir, HFQuantConfigFileName)
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	cfg, _, err := readJSONObject(path)
	if err != nil {
		return err
	}
	c.HFQuant = cfg
	return nil
}

// readJSONObject reads a JSON object of at most maxConfigBytes (a config
// file; its base name names it in the size error), decoded and as bytes.
func readJSONObject(path string) (map[string]any, []byte, error) {
	b, err := safeio.ReadFile(path, maxConfigBytes, filepath.Base(path))
	if err != nil {
		return nil, nil, err
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, nil, fmt.Errorf("%s: not a JSON object: %v", path, err)
	}
	if cfg == nil {
		return nil, nil, fmt.Errorf("%s: not a JSON object", path)
	}
	return cfg, b, nil
}

// HFQuantConfig hands family hf_quant_config.json (family.HFQuantConfigs).
func (c *Checkpoint) HFQuantConfig() map[string]any { return c.HFQuant }

func (c *Checkpoint) exists(name string) bool {
	st, err := os.Stat(filepath.Join(c.Dir, name))
	return err == nil && st.Mode().IsRegular()
}

// glob lists the regular files of Dir with one of the suffixes, following
// symbolic links to files (a hub cache snapshot links every file).
func (c *Checkpoint) glob(suffixes ...string) []string {
	entries, _ := os.ReadDir(c.Dir)
	var out []string
	for _, e := range entries {
		if !e.Type().IsRegular() && !c.exists(e.Name()) {
			continue
		}
		for _, s := range suffixes {
			if strings.HasSuffix(e.Name(), s) {
				out = append(out, e.Name())
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

func (c *Checkpoint) openWeights() error {
	if ok, err := safetensorsFormat.open(c); ok {
		return err
	}
	if ok, err := torchFormat.open(c); ok {
		return err
	}
	return fmt.Errorf("%s: no weights found (expected %s, model.safetensors, %s or pytorch_model.bin)", c.Dir, safetensors.IndexFileName, torchbin.IndexFileName)
}

// weightFormat is how Open finds and opens one format's weight files (F)
// and sharded checkpoints (S).
type weightFormat[F, S io.Closer] struct {
	format   string   // Checkpoint.Format
	index    string   // the sharded checkpoint's index file
	single   string   // the one file of an unsharded checkpoint
	suffixes []string // any other weight file
	kind     string   // the files, in the error for several without an index
	openFile func(path string) (F, error)
	openDir  func(dir string) (S, error)
	shards   func(S) []F
	count    func(F) int // the tensors a file holds, to size the lookup once
	path     func(F) string
	add      func(*Checkpoint, F) error
}

var safetensorsFormat = weightFormat[*safetensors.File, *safetensors.Sharded]{
	format: FormatSafetensors, index: safetensors.IndexFileName, single: "model.safetensors",
	suffixes: []string{".safetensors"}, kind: ".safetensors",
	openFile: safetensors.Open, openDir: safetensors.OpenSharded,
	shards: func(s *safetensors.Sharded) []*safetensors.File { return s.Shards },
	count:  func(f *safetensors.File) int { return len(f.Tensors) },
	path:   func(f *safetensors.File) string { return f.Path },
	add:    (*Checkpoint).addSafetensors,
}

var torchFormat = weightFormat[*torchbin.File, *torchbin.Sharded]{
	format: FormatTorch, index: torchbin.IndexFileName, single: "pytorch_model.bin",
	suffixes: []string{".bin", ".pt", ".pth"}, kind: "PyTorch",
	openFile: torchbin.Open, openDir: torchbin.OpenSharded,
	shards: func(s *torchbin.Sharded) []*torchbin.File { return s.Shards },
	count:  func(f *torchbin.File) int { return len(f.Tensors) },
	path:   func(f *torchbin.File) string { return f.Path },
	add:    (*Checkpoint).addTorch,
}

// open opens c's weights if they are in this format: the index and its
// shards, else the single file, else the one weight file there is. ok is
// false when c holds none of them.
func (w weightFormat[F, S]) open(c *Checkpoint) (ok bool, err error) {
	switch {
	case c.exists(w.index):
		return true, w.openSharded(c)
	case c.exists(w.single):
		return true, w.openFiles(c, []string{w.single})
	}
	files := c.glob(w.suffixes...)
	switch {
	case len(files) == 0:
		return false, nil
	case len(files) > 1:
		return true, fmt.Errorf("%s: %d %s files but no %s to say which tensors each holds", c.Dir, len(files), w.kind, w.index)
	}
	return true, w.openFiles(c, files)
}

func (w weightFormat[F, S]) openSharded(c *Checkpoint) error {
	c.Format = w.format
	s, err := w.openDir(c.Dir)
	if err != nil {
		return err
	}
	// The shards are kept, not s: its index (a map of every tensor name,
	// checked against the shards by openDir) is not needed again.
	shards := w.shards(s)
	c.closers = append(c.closers, closeAll[F](shards))
	c.WeightFiles = append(c.WeightFiles, w.index)
	n := 0
	for _, f := range shards {
		n += w.count(f)
	}
	c.reserve(n)
	for _, f := range shards {
		c.WeightFiles = append(c.WeightFiles, filepath.Base(w.path(f)))
		if err := w.add(c, f); err != nil {
			return err
		}
	}
	return nil
}

func (w weightFormat[F, S]) openFiles(c *Checkpoint, names []string) error {
	c.Format = w.format
	for _, name := range names {
		f, err := w.openFile(filepath.Join(c.Dir, name))
		if err != nil {
			return err
		}
		c.closers = append(c.closers, f)
		c.WeightFiles = append(c.WeightFiles, name)
		c.reserve(w.count(f))
		if err := w.add(c, f); err != nil {
			return err
		}
	}
	return nil
}

// closeAll closes files as one io.Closer.
type closeAll[F io.Closer] []F

func (fs closeAll[F]) Close() error { return safeio.CloseAll([]F(fs)) }

// reserve sizes the name lookup and the tensor list for n more tensors
// before the first is added, so neither grows (and copies itself) tensor by
// tensor; n is a file's own count, bounded by its reader, and at most
// MaxTensors is reserved.
func (c *Checkpoint) reserve(n int) {
	n = min(n, MaxTensors)
	if len(c.byName) == 0 {
		c.byName = make(map[string]*Tensor, n)
	}
	c.Tensors = slices.Grow(c.Tensors, n)
}

func (c *Checkpoint) add(t *Tensor) error {
	if len(c.Tensors) >= MaxTensors {
		return fmt.Errorf("%s: more than %d tensors in the checkpoint (the limit; not a real checkpoint?)", t.File, MaxTensors)
	}
	if prev, dup := c.byName[t.Name]; dup {
		return fmt.Errorf("%s: tensor %q also in %s", t.File, t.Name, prev.File)
	}
	c.byName[t.Name] = t
	c.Tensors = append(c.Tensors, t)
	c.modules = nil
	return nil
}

// addSafetensors adds f's tensors, then drops f's own list of them: each
// Tensor keeps the header's name and shape and a section of the open file,
// which is all that is read again. The Tensors and their sections are
// allocated together, two allocations a file instead of two a tensor.
func (c *Checkpoint) addSafetensors(f *safetensors.File) error {
	ts := make([]Tensor, len(f.Tensors))
	secs := make([]io.SectionReader, len(f.Tensors))
	r := f.ReaderAt()
	for i, ti := range f.Tensors {
		secs[i] = *io.NewSectionReader(r, f.DataStart+ti.Begin, ti.NumBytes())
		ts[i] = Tensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, File: f.Path, Data: &secs[i]}
		if err := c.add(&ts[i]); err != nil {
			return err
		}
	}
	f.ForgetTensors()
	return nil
}

func (c *Checkpoint) addTorch(f *torchbin.File) error {
	for _, t := range f.Tensors {
		if err := c.add(&Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, File: f.Path, Data: t.Data}); err != nil {
			return err
		}
	}
	return nil
}

// Tensor finds a tensor by name, or a view of one (view.go).
func (c *Checkpoint) Tensor(name string) (*Tensor, bool) {
	if t, ok := c.byName[name]; ok {
		return t, true
	}
	if BaseName(name) == name {
		return nil, false
	}
	t, err := c.view(name)
	return t, err == nil
}

// Lookup implements family.Tensors.
func (c *Checkpoint) Lookup(name string) (family.TensorMeta, bool) {
	t, ok := c.Tensor(name)
	if !ok {
		return family.TensorMeta{}, false
	}
	return family.TensorMeta{Name: t.Name, DType: t.DType, Shape: t.Shape}, true
}

// Names implements family.Tensors: every tensor name in file order.
func (c *Checkpoint) Names() []string {
	out := make([]string, len(c.Tensors))
	for i, t := range c.Tensors {
		out[i] = t.Name
	}
	return out
}

// QuantModules implements family.ModulesMemo: the modules under layers are
// collected once per checkpoint (build), however many descriptions a plan
// checks. A tensor added later (none is, after Open) would clear it.
func (c *Checkpoint) QuantModules(layers []string, build func() *quantdesc.Modules) *quantdesc.Modules {
	key := strings.Join(layers, "\x00")
	c.modulesMu.Lock()
	defer c.modulesMu.Unlock()
	if m, ok := c.modules[key]; ok {
		return m
	}
	m := build()
	if c.modules == nil {
		c.modules = map[string]*quantdesc.Modules{}
	}
	c.modules[key] = m
	return m
}

// TotalBytes is the sum of all tensors' sizes.
func (c *Checkpoint) TotalBytes() int64 {
	var n int64
	for _, t := range c.Tensors {
		n += t.NumBytes()
	}
	return n
}

// Plan detects the model family from config.json and plans its MoE layers.
func (c *Checkpoint) Plan() (*family.Plan, error) {
	p, err := family.Detect(c.Config, c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Dir, err)
	}
	return p, nil
}

// OtherFiles lists the files under Dir, relative to it, that are neither
// weights nor their index nor config.json: tokenizer files,
// generation_config.json, README and the like, which converters copy as
// they are. Hidden files and folders (.git, .cache) are skipped.
//
// Symbolic links to regular files count as the files they point to: a hub
// cache snapshot (models--org--name/snapshots/REV) is nothing but links into
// blobs/, and its tokenizer is as much a part of the model as its weights.
// Anything that cannot be copied as a file (a link to a directory, a
// dangling link, a named pipe, a socket, a device) is an error rather than
// a file silently left behind.
func (c *Checkpoint) OtherFiles() ([]string, error) {
	skip := map[string]bool{ConfigFileName: true}
	for _, w := range c.WeightFiles {
		skip[w] = true
	}
	// Walk the directory the path resolves to: WalkDir does not descend
	// into a root that is itself a link.
	root, err := filepath.EvalSymlinks(c.Dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Dir, safeio.Unwrap(err))
	}
	var out []string
	visited := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if visited++; visited > maxWalkEntries {
			return fmt.Errorf("%s: more than %d files and directories (the limit; not a checkpoint directory?)", c.Dir, maxWalkEntries)
		}
		rel, _ := filepath.Rel(root, path)
		if rel == "." {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || skip[rel] {
			return nil
		}
		mode := d.Type()
		if mode&fs.ModeSymlink != 0 {
			st, err := os.Stat(path)
			if err != nil {
				return fmt.Errorf("%s: a symbolic link whose target cannot be read (%v); moeprep would have to leave it out of the output", filepath.Join(c.Dir, rel), safeio.Unwrap(err))
			}
			mode = st.Mode()
		}
		if !mode.IsRegular() {
			return fmt.Errorf("%s: %s; moeprep copies regular files (and links to them) only, so it would be left out of the output: move it away", filepath.Join(c.Dir, rel), safeio.Kind(mode))
		}
		if len(out) >= maxOtherFiles {
			return fmt.Errorf("%s: more than %d files besides the weights (the limit; not a checkpoint directory?)", c.Dir, maxOtherFiles)
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s: listing files: %w", c.Dir, err)
		}
		return nil, err
	}
	return out, nil
}

// Close releases every open file.
func (c *Checkpoint) Close() error {
	err := safeio.CloseAll(c.closers)
	c.closers = nil
	return err
}

// SmallTensorBytes reads the whole of a tensor of at most max bytes
// (family.TensorBytes: compressed-tensors' weight_shape).
func (c *Checkpoint) SmallTensorBytes(name string, max int64) ([]byte, error) {
	t, ok := c.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("tensor %s is missing", name)
	}
	n := t.NumBytes()
	if n < 0 || n > max {
		return nil, fmt.Errorf("%s: tensor %s holds %d bytes, over the %d expected", t.File, name, n, max)
	}
	if sec, ok := t.Data.(*io.SectionReader); ok && n <= smallWindowBytes {
		c.adviseSmall(max)
		if r, base, size := sec.Outer(); size >= n && base >= 0 {
			if b, ok := c.small.read(r, base, n); ok {
				return b, nil
			}
		}
	}
	b := make([]byte, n)
	if got, err := t.Data.ReadAt(b, 0); int64(got) != n {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%s: reading tensor %s: %w", t.File, name, err)
	}
	return b, nil
}

// Source finds tensors by name: a *Checkpoint, or what holds one.
type Source interface {
	Tensor(name string) (*Tensor, bool)
}

// RequantisedMLP is m, a plain MLP of src (fuse-shared --requantize-shared's
// shared expert), with its gate, up and down weights quantised into format
// f (Requantised): an MLP naming the computed weights and scales, each of
// which add is handed.
func RequantisedMLP(src Source, m family.MLP, f weightfmt.Format, add func(*Tensor)) (family.MLP, error) {
	out := m
	for _, pj := range layout.MLPProjs {
		t, ok := src.Tensor(out.Weight(pj))
		if !ok {
			return family.MLP{}, fmt.Errorf("shared expert tensor %s is missing", out.Weight(pj))
		}
		w, s, err := Requantised(t, f)
		if err != nil {
			return family.MLP{}, err
		}
		add(w)
		add(s)
		out.Set(pj, layout.RoleWeight, w.Name)
		out.Set(pj, layout.RoleScale, s.Name)
	}
	return out, nil
}
