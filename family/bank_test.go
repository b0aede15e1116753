package family

import "testing"

// TestLayerKey: a layer's written index is its decoder layer's, plus 65536
// for a second bank (the contract's and the report's form), and reads back
// as the decoder layer and bank (a first bank's key does not say which).
func TestLayerKey(t *testing.T) {
	for _, c := range []struct {
		l         Layer
		key       int
		name      string
		label     string
		backIndex int
		backBank  Bank
	}{
		{Layer{Index: 3}, 3, "", "3", 3, NoBank},
		{Layer{Index: 61, MTP: true}, 61, "", "61", 61, NoBank},
		{Layer{Index: 3, Bank: BankText}, 3, "text", "3", 3, NoBank},
		{Layer{Index: 3, Bank: BankVision}, 65539, "vision", "3 (vision bank)", 3, BankVision},
		{Layer{Index: 0, Bank: BankVision}, 65536, "vision", "0 (vision bank)", 0, BankVision},
	} {
		if got := c.l.Key(); got != c.key {
			t.Errorf("%+v: key %d, want %d", c.l, got, c.key)
		}
		if got := c.l.Bank.String(); got != c.name {
			t.Errorf("%+v: bank %q, want %q", c.l, got, c.name)
		}
		if got := c.l.Label(); got != c.label || KeyLabel(c.key) != c.label {
			t.Errorf("%+v: label %q, key label %q, want %q", c.l, got, KeyLabel(c.key), c.label)
		}
		if i, b := SplitLayerKey(c.key); i != c.backIndex || b != c.backBank {
			t.Errorf("SplitLayerKey(%d) = %d, %v; want %d, %v", c.key, i, b, c.backIndex, c.backBank)
		}
	}
}
