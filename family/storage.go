package family

// expertStorage is how a family's routed experts lie on disk: each expert's
// tensors of its own (perExpert), every expert's gate and up in one stack
// (stackedGateUp), one stack per projection (stackedPerProj), or the
// experts flattened into one tensor per projection (flatExperts). It
// checks a MoE layer's expert tensors and names each expert's projections
// (the tensors, or views of a stack), so that everything downstream reads
// family.MLP and never the storage. naming.storage picks one from the
// family's data; a new layout is one more type and its case there.
type expertStorage interface {
	// experts checks the routed experts of the MoE module at prefix
	// (where names the layer in errors; names are the layer's tensors)
	// and returns one MLP per expert.
	experts(k *checker, where, prefix string, names []string) ([]MLP, error)
}

// sharedStorage is how a family's shared experts lie on disk under their
// module sp: one MLP of per-projection tensors (sharedPerProj), one MLP
// with gate and up in one tensor (sharedGateUp), or S experts stacked
// (sharedStacked). naming.sharedStorage picks one.
type sharedStorage interface {
	// present says whether the module sp holds the shared expert's
	// tensors.
	present(k *checker, sp string) bool
	// plan checks them and sets out's Shared (one MLP) or SharedExperts
	// (stacked).
	plan(k *checker, where, sp string, out *Layer) error
}
