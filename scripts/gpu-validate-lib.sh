# Sourced (from the repository root) by the gpu-validate-*.sh scripts that
# run on the GPU machine: what they each did the same way.

# need_bin sets bin to the cross-built binary (.gpu/moeprep) or exits 2.
need_bin() {
	bin=$(pwd)/.gpu/moeprep
	[ -x "$bin" ] || { echo "no $bin: cross-build it first (see the header)" >&2; exit 2; }
}

# scratch removes the paths it is given now and again when the script exits.
scratch() {
	scratch_paths=("$@")
	trap 'rm -rf "${scratch_paths[@]}"' EXIT
	rm -rf "$@"
}

# gpu_setup loads CUDA modules eagerly and prints the GPU, the free space of
# /dev/shm and here, and the memory. The driver's lazy module loading read
# kernel images after Go had freed them (validate preloads every kernel;
# eager loading is belt and braces).
gpu_setup() {
	export CUDA_MODULE_LOADING=EAGER
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
	df -h /dev/shm . | sed 's/^/  /'
	free -g | sed 's/^/  /'
}

# t runs its arguments, prints their exit status and seconds, and returns
# the status.
t() { local s=$SECONDS; "$@"; local rc=$?; echo "  -> rc=$rc in $((SECONDS - s))s"; return $rc; }
