package family

import (
	"fmt"
	"strconv"
)

// Bank is which routed bank of its decoder layer a MoE layer is, where a
// decoder layer holds more than one (ERNIE-4.5-VL: text and vision
// experts, each with its own router); NoBank where it holds one.
type Bank uint8

const (
	NoBank Bank = iota
	BankText
	BankVision
)

// String is the bank's name as the contract, the validate report and
// inspect write it: "text", "vision", "" for NoBank.
func (b Bank) String() string {
	switch b {
	case BankText:
		return "text"
	case BankVision:
		return "vision"
	}
	return ""
}

// Second: the bank is its decoder layer's second, listed with the first
// wherever people name decoder layers.
func (b Bank) Second() bool { return b == BankVision }

// bankStride is what LayerKey adds to a decoder layer's index for its
// second routed bank. Decoder layers are bounded by maxLayers, far below.
const bankStride = 1 << 16

// Key is the layer's index in moeprep's written forms: the contract's
// layers[].index (layout.LayerInfo), the validate report's layer lists and
// rows, inspect's lists. It is Index, plus 65536 for a decoder layer's
// second routed bank (ERNIE-4.5-VL's vision experts). Those forms were
// written with that offset before the bank was a field of the layer, and
// contracts already converted carry it, so they keep it byte for byte; it
// is made here and read back by SplitLayerKey, and nowhere else. Code that
// holds a Layer compares Index and Bank.
func (l Layer) Key() int { return LayerKey(l.Index, l.Bank) }

// LayerKey is the written index (Layer.Key) of decoder layer index's
// routed bank b.
func LayerKey(index int, b Bank) int {
	if b.Second() {
		return index + bankStride
	}
	return index
}

// SplitLayerKey reads a written index (Layer.Key) back as its decoder layer
// and bank: NoBank for a decoder layer's first (or only) bank, whose key
// does not say which, BankVision for the second.
func SplitLayerKey(key int) (int, Bank) {
	if key >= bankStride {
		return key - bankStride, BankVision
	}
	return key, NoBank
}

// Label names the layer for people: "3", or "3 (vision bank)" for a decoder
// layer's second bank.
func (l Layer) Label() string { return LayerLabel(l.Index, l.Bank) }

// LayerLabel names decoder layer index's bank b as Layer.Label does.
func LayerLabel(index int, b Bank) string {
	if b.Second() {
		return fmt.Sprintf("%d (%s bank)", index, b)
	}
	return strconv.Itoa(index)
}

// KeyLabel names a written index (Layer.Key) as Layer.Label does.
func KeyLabel(key int) string { return LayerLabel(SplitLayerKey(key)) }
