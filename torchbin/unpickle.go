package torchbin

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"
)

// storageEntry locates the zip entry data/<key> of one storage.
type storageEntry struct {
	nbytes int64 // entry size
	offset int64 // absolute file offset of the entry's first byte
}

// storageLookup resolves a storage key to its archive entry. It must not
// read the storage.
type storageLookup func(key string) (storageEntry, error)

// namedView is one tensor of a state dict, in pickle order.
type namedView struct {
	name string
	view *tensorView
}

// stateDict is the result of unpickling data.pkl.
type stateDict struct {
	tensors []namedView
	skipped []string // keys of scalar values that are not tensors
}

// parseStateDict scans and unpickles data.pkl and extracts the state dict.
// Errors name the tensor key where one is known; the caller prefixes the
// file.
func parseStateDict(pkl []byte, lookup storageLookup) (*stateDict, error) {
	end, err := scanPickle(pkl)
	if err != nil {
		return nil, err
	}
	return unpickle(pkl[:end], lookup)
}

// unpickle runs gopickle over a pickle that scanPickle accepted.
func unpickle(pkl []byte, lookup storageLookup) (*stateDict, error) {
	pl := &persistentLoader{lookup: lookup, seen: make(map[string]*storageRef)}
	u := pickle.NewUnpickler(bytes.NewReader(pkl))
	u.FindClass = findClass
	u.PersistentLoad = pl.load
	obj, err := u.Load()
	if err != nil {
		return nil, shortError(err)
	}
	return extractStateDict(obj)
}

// maxErrorLen bounds gopickle's error messages, which print whole Python
// values with %#v.
const maxErrorLen = 300

type truncatedError struct {
	msg string
	err error
}

func (e *truncatedError) Error() string { return e.msg }
func (e *truncatedError) Unwrap() error { return e.err }

// shortError keeps an error to one short line.
func shortError(err error) error {
	msg := err.Error()
	if len(msg) <= maxErrorLen && !strings.ContainsAny(msg, "\r\n") {
		return err
	}
	msg = strings.NewReplacer("\r", " ", "\n", " ").Replace(msg)
	if len(msg) > maxErrorLen {
		msg = msg[:maxErrorLen] + "..."
	}
	return &truncatedError{msg: msg, err: err}
}

type persistentLoader struct {
	lookup storageLookup
	seen   map[string]*storageRef
}

// load resolves ('storage', storage_class, key, location, numel). The same
// key may appear many times (tied weights); it must name the same class.
func (p *persistentLoader) load(pid any) (any, error) {
	items, ok := tupleItems(pid)
	if !ok || len(items) != 5 {
		return nil, fmt.Errorf("persistent id is %s, not a 5-tuple ('storage', class, key, location, numel)", pyType(pid))
	}
	if tag, _ := items[0].(string); tag != "storage" {
		return nil, fmt.Errorf("persistent id tag is %s, want 'storage'", pyValue(items[0]))
	}
	class, ok := items[1].(*storageClass)
	if !ok {
		return nil, fmt.Errorf("persistent id storage class is %s", pyType(items[1]))
	}
	key, ok := items[2].(string)
	if !ok || !validStorageKey(key) {
		return nil, fmt.Errorf("persistent id storage key %s is not a plain entry name", pyValue(items[2]))
	}
	if _, ok := items[3].(string); !ok {
		return nil, fmt.Errorf("storage %q: location is %s, not a str", key, pyType(items[3]))
	}
	numel, ok := asInt64(items[4])
	if !ok || numel < 0 {
		return nil, fmt.Errorf("storage %q: numel is %s, not a non-negative int", key, pyValue(items[4]))
	}
	if ref, ok := p.seen[key]; ok {
		if ref.class.name != class.name {
			return nil, fmt.Errorf("storage %q is used as both %s and %s", key, ref.class.name, class.name)
		}
		return ref, checkNumel(ref, numel)
	}
	if len(p.seen) >= maxTensors {
		return nil, fmt.Errorf("more than %d storages, the limit for one checkpoint file", maxTensors)
	}
	ent, err := p.lookup(key)
	if err != nil {
		return nil, err
	}
	ref := &storageRef{key: key, class: class, nbytes: ent.nbytes, offset: ent.offset}
	if err := checkNumel(ref, numel); err != nil {
		return nil, err
	}
	p.seen[key] = ref
	return ref, nil
}

// checkNumel compares the element count of the persistent id with the entry
// size. An untyped storage counts bytes.
func checkNumel(ref *storageRef, numel int64) error {
	esz := int64(1)
	if ref.class.dtype != "" {
		esz = int64(ref.class.dtype.Size())
	}
	if ref.nbytes%esz != 0 || ref.nbytes/esz != numel {
		return fmt.Errorf("storage %q: entry data/%s holds %d bytes, but the pickle says %d elements of %d bytes (%s)",
			ref.key, ref.key, ref.nbytes, numel, esz, ref.class.name)
	}
	return nil
}

// validStorageKey accepts what torch writes (decimal numbers, or any name
// without path separators) and nothing that could leave data/.
func validStorageKey(k string) bool {
	return k != "" && k != "." && k != ".." && !strings.ContainsAny(k, "/\\\x00")
}

// dictEntry is one key/value pair of a pickled dict, in insertion order.
type dictEntry struct {
	key string
	val any
}

// dictEntries lists a dict's string-keyed entries in Python order. A plain
// dict keeps every SETITEM in gopickle, so later duplicates overwrite the
// value at the first position, as Python does.
func dictEntries(v any) ([]dictEntry, bool, error) {
	var out []dictEntry
	switch d := v.(type) {
	case *types.OrderedDict:
		for e := d.List.Front(); e != nil; e = e.Next() {
			ent, ok := e.Value.(*types.OrderedDictEntry)
			if !ok {
				return nil, true, fmt.Errorf("malformed OrderedDict entry")
			}
			k, ok := ent.Key.(string)
			if !ok {
				return nil, true, fmt.Errorf("dict key %s is not a str", pyValue(ent.Key))
			}
			out = append(out, dictEntry{k, ent.Value})
		}
	case *types.Dict:
		pos := make(map[string]int, len(*d))
		for _, ent := range *d {
			k, ok := ent.Key.(string)
			if !ok {
				return nil, true, fmt.Errorf("dict key %s is not a str", pyValue(ent.Key))
			}
			if i, dup := pos[k]; dup {
				out[i].val = ent.Value
				continue
			}
			pos[k] = len(out)
			out = append(out, dictEntry{k, ent.Value})
		}
	default:
		return nil, false, nil
	}
	return out, true, nil
}

// extractStateDict finds the name -> tensor mapping in the unpickled object.
func extractStateDict(obj any) (*stateDict, error) {
	top, isDict, err := dictEntries(obj)
	if err != nil {
		return nil, fmt.Errorf("top-level dict: %w", err)
	}
	if !isDict {
		return nil, fmt.Errorf("top-level object is %s, not a dict of tensors (a state dict)", pyType(obj))
	}
	if inner, key, err := unwrap(top); err != nil {
		return nil, err
	} else if inner != nil {
		sd, err := collectTensors(inner)
		if err != nil {
			return nil, fmt.Errorf("in %q: %w", key, err)
		}
		return sd, nil
	}
	return collectTensors(top)
}

// unwrap returns the nested state dict of a one-level wrapper such as
// {"state_dict": sd, "epoch": 3}, or nil when top is not one (then top is
// taken as the state dict itself). Beside the wrapped dict only scalars are
// allowed; an optimizer state or a second model is refused by key.
func unwrap(top []dictEntry) ([]dictEntry, string, error) {
	for _, e := range top {
		if _, ok := e.val.(*tensorView); ok {
			return nil, "", nil
		}
	}
	var inner []dictEntry
	innerKey := ""
	for _, e := range top {
		if e.key != "state_dict" && e.key != "model" {
			continue
		}
		entries, isDict, err := dictEntries(e.val)
		if !isDict {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("in %q: %w", e.key, err)
		}
		if innerKey != "" {
			return nil, "", fmt.Errorf("top-level dict holds both %q and %q; save the model's state_dict() alone", innerKey, e.key)
		}
		inner, innerKey = entries, e.key
	}
	if innerKey == "" {
		return nil, "", nil
	}
	for _, e := range top {
		if e.key != innerKey && !isScalar(e.val) {
			return nil, "", fmt.Errorf("top-level key %q holds a %s beside %q; save the model's state_dict() alone", e.key, pyType(e.val), innerKey)
		}
	}
	return inner, innerKey, nil
}

// collectTensors keeps tensors in order, skips scalar metadata and refuses
// any other value by key.
func collectTensors(entries []dictEntry) (*stateDict, error) {
	sd := &stateDict{}
	for _, e := range entries {
		switch v := e.val.(type) {
		case *tensorView:
			if e.key == "" {
				return nil, fmt.Errorf("a tensor has an empty name")
			}
			if len(sd.tensors) >= maxTensors {
				return nil, fmt.Errorf("more than %d tensors, the limit for one checkpoint file", maxTensors)
			}
			sd.tensors = append(sd.tensors, namedView{e.key, v})
		default:
			if !isScalar(v) {
				return nil, fmt.Errorf("key %q holds a %s, not a tensor; save a plain state_dict()", e.key, pyType(v))
			}
			sd.skipped = append(sd.skipped, e.key)
		}
	}
	return sd, nil
}
