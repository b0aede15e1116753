# Sourced (from the repository root) by the GPU scripts that run on the GPU
# machine (gpu-validate-*.sh, gpu-compare-builds.sh): what they each did
# the same way.

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

# uncache drops every file under the directories it is given from the page
# cache (posix_fadvise DONTNEED: no root needed, nobody else's files
# touched), for a cold run where drop_caches is not writable.
uncache() {
	python3 - "$@" <<'PY'
import os, sys
for d in sys.argv[1:]:
    for root, _, files in os.walk(d):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
PY
}

# report_norm REPORT prints a --json report with what varies from run to
# run left out (times, the tool's version, the paths, the summary line), its
# keys sorted: two builds' reports of the same run compare equal with cmp.
report_norm() {
	python3 -c 'import json,sys
drop={"tool","seconds","wall_s","io_s","compute_s","summary","src","dst"}
def w(v):
    if isinstance(v,dict): return {k:w(x) for k,x in v.items() if k not in drop and not k.endswith("_seconds") and k!="timings"}
    if isinstance(v,list): return [w(x) for x in v]
    return v
print(json.dumps(w(json.load(open(sys.argv[1]))),sort_keys=True))' "$1"
}
