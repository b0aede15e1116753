package torchbin

// Limits on what one checkpoint file may make the reader do. A hostile file
// of a few kilobytes can otherwise ask for gigabytes of memory or minutes of
// work (a deflated data.pkl of millions of MARKs, an int of millions of
// digits), or claim tensors far larger than the bytes it holds.
//
// The design point is a single file holding 10,000 tensors, which the count
// limits below admit ten times over (so files of about 100,000 tensors
// load): the largest PyTorch shard of a real MoE checkpoint holds a few
// thousand (Switch-Base-256, unsharded, about 7,000; DeepSeek-V3 and Kimi-K2
// hold about 90k and 140k tensors in all, over dozens of shards, and ship
// safetensors).
// torch.save writes about 175 bytes, 36 opcodes, 9 memo entries, 13
// allocated values (2 of them MARKs) and 19 container items per tensor of
// an MoE shard, _metadata included, and batches dict items 1000 at a time;
// TestLimitsAdmitLargeShard measures these on a torch-style pickle of that
// size and requires every count limit below to stay at least 10 times
// above it. scanPickle checks each limit before gopickle builds anything,
// so a file over a limit costs only the scan up to where it is refused.
//
// Within the limits the cost is linear in the counts, at gopickle's rate:
// 100k tensors take it about 1.25 s of CPU and 280 MB, and a crafted file
// sitting just under every limit costs some ten times the design point's
// counts' worth: about 1.7 s and 210 MB (12.5M memoized empty dicts cost
// 16.5 s and 2.1 GB at limits ten times these). That is the bound
// for any file (5 s, 300 MB), not only for the files the red team tried.
const (
	// maxPickleBytes bounds data.pkl, read into memory as it is scanned.
	// 10k tensors with 50-character names take 1.75 MB.
	maxPickleBytes = 32 << 20

	// maxPickleOps bounds the opcodes executed: 36 per tensor, 355k for
	// the design point.
	maxPickleOps = 4 << 20

	// maxStackDepth bounds the values on the unpickler's stack, all MARK
	// levels together. CPython batches dict and list items by 1000, so
	// torch.save never stacks more than about 2000; a writer that does not
	// batch stacks two values per tensor of its state dict.
	maxStackDepth = 256 << 10

	// maxMarkDepth bounds nested MARKs. A state dict nests three (the
	// dict's items, a rebuild call's arguments, a storage's persistent id),
	// one more inside a {"state_dict": ...} wrapper.
	maxMarkDepth = 64

	// maxMarks bounds MARK opcodes in all. Each costs gopickle a fresh
	// 16-slot stack (256 bytes), the most any one byte of pickle costs;
	// torch.save writes two per tensor.
	maxMarks = 256 << 10

	// maxMemoEntries bounds the memo. torch.save memoizes about 9 values
	// per tensor and numbers them 0, 1, 2, ... in order; the scanner
	// requires that order, so the memo is a dense array.
	maxMemoEntries = 1 << 20

	// maxMemoSkip bounds how far past the entries so far a PUT may number
	// a new one. Writers number them in order (CPython: the next index,
	// always); a far jump would only inflate the scanner's dense memo.
	maxMemoSkip = 256

	// maxObjects bounds the values the unpickler allocates: MARKs,
	// containers (EMPTY_DICT, TUPLE, LIST, ...), strings, globals,
	// persistent ids and call results. About 13 per tensor. Each costs
	// gopickle 24 to 256 bytes (an empty dict: 160).
	maxObjects = 3 << 19

	// maxContainerItems bounds the items placed into tuples, lists, dicts
	// and sets, counted over the whole pickle (so also per container):
	// about 19 per tensor.
	maxContainerItems = 2 << 20

	// maxIntBytes bounds the payload of LONG1 and LONG4 before it is
	// decoded (gopickle's decoding is quadratic in it). torch needs int64
	// at most, which pickle writes in 8 bytes (9 for the largest uint64).
	maxIntBytes = 16

	// maxIntText bounds the digits of the text INT and LONG opcodes before
	// they are parsed: int64 is 19 digits, a sign and a trailing L.
	maxIntText = 32

	// maxFloatText bounds the text FLOAT opcode; repr of a float64 is at
	// most 24 characters.
	maxFloatText = 64

	// maxGlobalName bounds the module and the name of a GLOBAL, INST or
	// STACK_GLOBAL. The allowlist's longest is "_rebuild_parameter_with_state"
	// (29 bytes); anything longer is refused by name anyway.
	maxGlobalName = 256

	// maxStringBytes bounds one str or bytes value. Tensor names are under
	// 1 KiB; a scalar string in a wrapped checkpoint (a git hash, an
	// argument) is a few KiB.
	maxStringBytes = 1 << 20

	// maxFrameBytes bounds a protocol 4 FRAME, which gopickle reads into a
	// buffer of its announced size. CPython's frames hold 64 KiB, or one
	// object more when an older Python wrote a large string inside a frame.
	maxFrameBytes = maxStringBytes + 1<<20

	// maxTrailingBytes bounds what may follow the pickle's STOP opcode in
	// data.pkl (torch writes nothing there; it is read only for the zip
	// checksum).
	maxTrailingBytes = 64 << 10

	// maxCallArgsPrint bounds how large gopickle's error for a refused
	// call may grow: it formats the call's arguments with %#v, which
	// prints every str and bytes argument whole. A rebuild call's
	// arguments print in under 1 KiB.
	maxCallArgsPrint = 64 << 10

	// maxTensors bounds the tensors (and so the distinct storages) of one
	// file: 13 times the design point.
	maxTensors = 1 << 17

	// maxZipEntries bounds the archive's entries: one per storage (at most
	// one per tensor) plus data.pkl, version, byteorder and the like.
	maxZipEntries = maxTensors + 1024

	// maxAliasFactor bounds the bytes all tensors of a file stream,
	// relative to the bytes of the storages they map (each storage counted
	// once), so that aliasing views cannot inflate a conversion's output.
	// Legitimate sharing: tied embedding and lm_head (2 views of one
	// storage), a fused qkv saved beside its q, k, v views (2), and the
	// T5/Switch family, whose shared embedding is saved as shared,
	// encoder.embed_tokens, decoder.embed_tokens and lm_head (4). Even a
	// file holding nothing but that embedding stays within 4 times.
	maxAliasFactor = 4
)
