package quantdesc

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/moeprep/moeprep/internal/jsoncfg"
	"github.com/moeprep/moeprep/internal/pyre"
)

// This file resolves a quantisation description's ignore/exclude lists:
// which tensor groups they leave unquantised. Each producer's list is read
// with its producer's semantics, against the checkpoint's own module names
// of every layer, at a bounded cost.

// listSyntax is how a producer's tool reads the entries of its list.
type listSyntax int

const (
	// syntaxRe: compressed-tensors' ignore, and transformers' and vLLM's
	// modules_to_not_convert / ignored_layers: "re:" entries are Python
	// regular expressions matched with re.match (from the start, a
	// prefix); other entries with '*', '?' or '[' are globs; the rest are
	// module names.
	syntaxRe listSyntax = iota
	// syntaxGlob: ModelOpt's exclude_modules (hf_quant_config.json, and
	// quant_method modelopt in config.json), which ModelOpt matches with
	// fnmatch: "re:" is no prefix there, a glob may hold any character.
	syntaxGlob
)

// Bounds on resolving one list: the steps its re: patterns may take over
// all the module names they are tried on (a step is one pattern node at
// one position; a real list over a 70,000-module checkpoint takes a few
// million), so a hostile list costs well under a second and a few MB.
const maxQuantMatchSteps = 1 << 25

// Modules are the module names a checkpoint's ignore lists are
// resolved against.
type Modules struct {
	// layers are the text layer prefixes (a wrapper's:
	// "language_model.model.layers."); nil for a bare text model.
	layers []string
	// groups holds, per tensor group, the modules of the text layers that
	// carry a matrix (rank >= 2: Linear layers and stacked experts, not
	// norms or biases), sorted; nil when no tensors are known.
	groups map[string][]string
	// sum fingerprints groups, for the resolution cache.
	sum uint64
}

// Representative is Modules knowing only the text layer prefixes (nil for
// a bare text model): every group is resolved against groupNames'
// representative names.
func Representative(layers []string) *Modules {
	return &Modules{layers: layers}
}

// ModulesOf collects a checkpoint's modules per tensor group from its
// tensor names, in its text layers (under layers; nil for a bare text
// model); matrix reports whether a tensor has rank 2 or more.
func ModulesOf(names []string, matrix func(name string) bool, layers []string) *Modules {
	m := &Modules{layers: layers}
	m.groups = map[string][]string{}
	prev := ""
	for _, name := range names {
		dot := strings.LastIndexByte(name, '.')
		if dot <= 0 {
			continue
		}
		mod := name[:dot]
		// A module's tensors are mostly adjacent (weight, weight_scale):
		// its first tensor of each run decides. A module whose tensors
		// come in several runs is listed once per matrix run and made
		// unique after the sort, instead of a map of every module name
		// (8 MB for Kimi-K2's 200,000 tensors) remembering them.
		if mod == prev || !underLayers(mod, layers) {
			continue
		}
		prev = mod
		if !matrix(name) {
			continue
		}
		if g := moduleGroup(mod); g != "" {
			m.groups[g] = append(m.groups[g], mod)
		}
	}
	h := fnv.New64a()
	for _, g := range quantGroups {
		if mods := m.groups[g]; mods != nil {
			slices.Sort(mods)
			m.groups[g] = slices.Clip(slices.Compact(mods))
		}
		for _, mod := range m.groups[g] {
			h.Write([]byte(mod))
			h.Write([]byte{0})
		}
		h.Write([]byte{1})
	}
	m.sum = h.Sum64()
	return m
}

func underLayers(name string, layers []string) bool {
	if len(layers) == 0 {
		return true
	}
	for _, pre := range layers {
		if strings.HasPrefix(name, pre) {
			return true
		}
	}
	return false
}

// matcher holds one description's ignore/exclude lists, each entry read as
// its producer reads it (listSyntax).
type matcher struct {
	q    jsoncfg.Object
	keys []string // the keys the entries came from, for messages
	mods *Modules
	// plain entries match a module name itself, a module whose name ends
	// in "."+entry, and the modules under it (entry+"."): as
	// transformers' should_convert_module reads them.
	plain map[string]bool
	pats  []pattern
	// cacheKey names the lists and the modules, for resolveCache.
	cacheKey string
	steps    int64
}

type pattern struct {
	key   string
	index int
	text  string
	re    *pyre.Regexp // one of re and glob
	glob  *pyre.Glob
}

func newMatcher(q jsoncfg.Object, mods *Modules, syntax listSyntax, keys ...string) (*matcher, error) {
	if mods == nil {
		mods = &Modules{}
	}
	m := &matcher{q: q, keys: keys, mods: mods, plain: map[string]bool{}}
	var ck strings.Builder
	fmt.Fprintf(&ck, "%d|%s|%x|%q", syntax, q.At, mods.sum, mods.layers)
	for _, key := range keys {
		list, err := q.Strs(key)
		if err != nil {
			return nil, err
		}
		if len(list) > maxQuantPatterns {
			return nil, q.Errorf(key, "%d entries, over the limit of %d", len(list), maxQuantPatterns)
		}
		fmt.Fprintf(&ck, "|%s:%d", key, len(list))
		for i, e := range list {
			if len(e) > maxQuantPatternLen {
				return nil, q.Errorf(key, "element %d: %d bytes, over the limit of %d", i, len(e), maxQuantPatternLen)
			}
			ck.WriteString("\x00" + e)
			p := pattern{key: key, index: i, text: e}
			switch {
			case syntax == syntaxRe && strings.HasPrefix(e, "re:"):
				re, err := pyre.Parse(strings.TrimPrefix(e, "re:"))
				if err != nil {
					return nil, q.Errorf(key, "element %d: %q is not a Python regular expression moeprep can read: %v", i, e, err)
				}
				p.re = re
			case syntax == syntaxGlob && pyre.HasMeta(e) || syntax == syntaxRe && strings.ContainsAny(e, "*?"):
				g, err := pyre.ParseGlob(e)
				if err != nil {
					return nil, q.Errorf(key, "element %d: %v", i, err)
				}
				p.glob = g
			default:
				m.plain[e] = true
				continue
			}
			if len(m.pats) >= maxQuantRegexes {
				return nil, q.Errorf(key, "more than %d patterns, over the limit", maxQuantRegexes)
			}
			m.pats = append(m.pats, p)
		}
	}
	// A digest, not the text: a list may hold thousands of 1 KB entries,
	// and the cache keeps its keys for the life of the process.
	sum := sha256.Sum256([]byte(ck.String()))
	m.cacheKey = string(sum[:])
	return m, nil
}

// matches reports whether an entry of the lists names the module. The
// patterns share one step budget (a name a pattern's prefilters reject
// costs one step): an error names the entry that spent it.
func (m *matcher) matches(name string) (bool, error) {
	if len(m.plain) > 0 {
		if m.plain[name] {
			return true, nil
		}
		for i := 0; i < len(name); i++ {
			if name[i] == '.' && (m.plain[name[:i]] || m.plain[name[i+1:]]) {
				return true, nil
			}
		}
	}
	if len(m.pats) == 0 {
		return false, nil
	}
	in := pyre.NewInput(name)
	for _, p := range m.pats {
		var ok bool
		var used int64
		var err error
		if p.glob != nil {
			ok, used, err = p.glob.MatchInput(in, maxQuantMatchSteps-m.steps)
		} else {
			ok, used, err = p.re.MatchInput(in, maxQuantMatchSteps-m.steps)
		}
		m.steps += used
		var be *pyre.BudgetError
		if errors.As(err, &be) {
			return false, m.q.Errorf(p.key, "element %d: %.80q: matching the list against the checkpoint's module names took over %d steps (at %q); moeprep refuses lists that costly", p.index, p.text, maxQuantMatchSteps, name)
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

// prune drops the patterns no name of at most longest characters can
// match (their shortest match is longer): a list of such patterns then
// costs nothing per module. Only for matching names that short.
func (m *matcher) prune(longest int) *matcher {
	short := *m
	short.pats = nil
	for _, p := range m.pats {
		minLen := int64(0)
		if p.glob != nil {
			minLen = p.glob.MinLen()
		} else {
			minLen = p.re.MinLen()
		}
		if minLen <= int64(longest) {
			short.pats = append(short.pats, p)
		}
	}
	return &short
}

// split says how a list divides a group's modules: all left unquantised,
// none, or some (one of each named, for the refusal).
type split struct {
	excluded  bool
	partlyIn  string // a module the list leaves unquantised...
	partlyOut string // ...beside one it does not
}

// excluded resolves the lists for a group: against the checkpoint's
// modules of that group in every text layer where it has any, else
// against groupNames' representative names (under each wrapper prefix in
// place of model.layers.).
func (m *matcher) excluded(group string) (split, error) {
	if mods := m.mods.groups[group]; len(mods) > 0 {
		longest := 0
		for _, mod := range mods {
			longest = max(longest, utf8.RuneCountInString(mod))
		}
		short := m.prune(longest)
		defer func() { m.steps = short.steps }()
		var s split
		for _, mod := range mods {
			ok, err := short.matches(mod)
			if err != nil {
				return split{}, err
			}
			if ok && s.partlyIn == "" {
				s.partlyIn = mod
			} else if !ok && s.partlyOut == "" {
				s.partlyOut = mod
			}
			if s.partlyIn != "" && s.partlyOut != "" {
				break
			}
		}
		s.excluded = s.partlyOut == ""
		return s, nil
	}
	for _, n := range groupNames[group] {
		names := []string{n}
		if len(m.mods.layers) > 0 {
			names = names[:0]
			for _, pre := range m.mods.layers {
				names = append(names, pre+strings.TrimPrefix(n, "model.layers."))
			}
		}
		for _, name := range names {
			ok, err := m.matches(name)
			if err != nil || ok {
				return split{excluded: ok}, err
			}
		}
	}
	return split{}, nil
}

// resolution is what resolve found: how each group is stored, and detail,
// non-empty when the lists leave part of the routed or shared experts
// unquantised (a refusal: moeprep plans one format per group).
type resolution struct {
	groups map[string]string
	detail string
	err    error
}

// resolveCache keeps resolutions for the life of the process: a command
// plans a checkpoint several times (detection, each format's check,
// inspect's report), and over a large checkpoint a list is worth
// resolving once. Bounded: cleared when full.
var resolveCache = struct {
	sync.Mutex
	m map[string]resolution
}{m: map[string]resolution{}}

const maxResolveCache = 64

// resolve says how each group is stored: label unless the lists exclude
// it. Routers are not quantisation targets (compressed-tensors targets
// Linear, which DeepSeek-style gates are not; ModelOpt and MXFP4 skip
// them) unless router is true.
func (m *matcher) resolve(label string, router bool) (map[string]string, string, error) {
	key := fmt.Sprintf("%s|%s|%v", m.cacheKey, label, router)
	resolveCache.Lock()
	r, ok := resolveCache.m[key]
	resolveCache.Unlock()
	if !ok {
		r = m.resolveUncached(label, router)
		resolveCache.Lock()
		if len(resolveCache.m) >= maxResolveCache {
			clear(resolveCache.m)
		}
		resolveCache.m[key] = r
		resolveCache.Unlock()
	}
	return maps.Clone(r.groups), r.detail, r.err
}

// resolutions counts uncached resolutions, for the test that a command
// resolves a list once.
var resolutions atomic.Int64

func (m *matcher) resolveUncached(label string, router bool) resolution {
	resolutions.Add(1)
	r := resolution{groups: map[string]string{}}
	for _, g := range quantGroups {
		if g == GroupRouter && !router {
			continue
		}
		s, err := m.excluded(g)
		if err != nil {
			return resolution{err: err}
		}
		if !s.excluded {
			r.groups[g] = label
		}
		if r.detail == "" && !s.excluded && s.partlyIn != "" && (g == GroupExperts || g == GroupShared) {
			r.detail = fmt.Sprintf("%s leaves %s unquantised but not %s; moeprep carries one %s format per checkpoint",
				m.q.At+strings.Join(m.keys, "/"), s.partlyIn, s.partlyOut, strings.TrimSuffix(g, "s"))
		}
	}
	return r
}
