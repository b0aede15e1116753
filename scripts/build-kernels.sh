#!/usr/bin/env bash
# Builds every kernels/cuda/*.cu into kernels/build/<name>.fatbin and writes
# kernels/build/BUILD.json (nvcc version, flags, each source's and fatbin's
# sha256; a source's sha256 covers the shared headers kernels/cuda/*.cuh too), which kernels/embed.go embeds and kernels' TestBuildMatchesSources
# checks in CI. Runs on the GPU machine (it has nvcc; the dev machine has not).
#
#   scripts/build-kernels.sh [OUT_DIR]     (default kernels/build)
#
# Each fatbin holds SASS for sm_80, sm_89 and sm_90a plus compute_80 PTX (so
# newer GPUs JIT it). ptxas resource reports go to $KERNEL_LOG_DIR
# (default /tmp/kernel-build-logs), not into the embedded directory.
# A source that fails to compile is left out of BUILD.json (CI then names it)
# and the script exits non-zero after building the others.
#
# KERNELS_ONLY="act_quant grouped_gemm_wg_fp8" rebuilds only those sources:
# the other fatbins already in OUT_DIR (a copy of kernels/build) are kept
# byte for byte and recorded as they are, so adding a kernel family does not
# churn the embedded fatbins of the others (their sources must be unchanged:
# TestBuildMatchesSources checks each source's hash).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-kernels/build}
logs=${KERNEL_LOG_DIR:-/tmp/kernel-build-logs}
nvcc=${NVCC:-nvcc}
mkdir -p "$out" "$logs"
flags="-O3 -std=c++17 --ptxas-options=-v -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_89,code=sm_89 -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=compute_80"

pids=()
names=()
for src in kernels/cuda/*.cu; do
	name=$(basename "$src" .cu)
	if [ -n "${KERNELS_ONLY:-}" ] && ! [[ " $KERNELS_ONLY " == *" $name "* ]]; then
		continue
	fi
	names+=("$name")
	# shellcheck disable=SC2086
	( "$nvcc" -fatbin $flags -o "$out/$name.fatbin.tmp" "$src" >"$logs/$name.log" 2>&1 \
		&& mv "$out/$name.fatbin.tmp" "$out/$name.fatbin" ) &
	pids+=($!)
done
failed=()
for i in "${!pids[@]}"; do
	if ! wait "${pids[$i]}"; then
		failed+=("${names[$i]}")
		echo "build-kernels: ${names[$i]}.cu FAILED:" >&2
		cat "$logs/${names[$i]}.log" >&2
		rm -f "$out/${names[$i]}.fatbin.tmp" "$out/${names[$i]}.fatbin"
	fi
done

NVCC_VERSION=$("$nvcc" --version | tr '\n' ' ' | sed 's/  */ /g') FLAGS="$flags" OUT="$out" ONLY="${KERNELS_ONLY:-}" python3 - <<'PY'
import datetime, hashlib, json, os, glob
out = os.environ["OUT"]
only = os.environ["ONLY"].split()
old = {}
if only and os.path.exists(os.path.join(out, "BUILD.json")):
    old = {k["source"]: k for k in json.load(open(os.path.join(out, "BUILD.json")))["kernels"]}
kernels = []
for src in sorted(glob.glob("kernels/cuda/*.cu")):
    name = os.path.basename(src)[:-3]
    fb = os.path.join(out, name + ".fatbin")
    if not os.path.exists(fb):
        continue
    # The source followed by every shared header (kernels/cuda/*.cuh) in name
    # order: a header change marks every fatbin stale (kernels' TestBuildMatchesSources).
    h = hashlib.sha256(open(src, "rb").read())
    for hdr in sorted(glob.glob("kernels/cuda/*.cuh")):
        h.update(open(hdr, "rb").read())
    sha = h.hexdigest()
    if only and name not in only:
        if name + ".cu" not in old:
            continue
        sha = old[name + ".cu"]["sha256"]  # kept fatbin: the source it was built from
    kernels.append({
        "source": name + ".cu",
        "sha256": sha,
        "fatbin": name + ".fatbin",
        "fatbin_sha256": hashlib.sha256(open(fb, "rb").read()).hexdigest(),
    })
info = {"nvcc_version": os.environ["NVCC_VERSION"].strip(), "flags": os.environ["FLAGS"],
        "built_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kernels": kernels}
with open(os.path.join(out, "BUILD.json"), "w") as f:
    json.dump(info, f, indent=1)
    f.write("\n")
PY
grep -h -E "Compiling entry|registers|spill" "$logs"/*.log | grep -B1 -A1 "sm_90a" | head -60 || true
if [ ${#failed[@]} -gt 0 ]; then
	echo "build-kernels: failed: ${failed[*]}" >&2
	exit 1
fi
echo "build-kernels: built ${names[*]} into $out"
