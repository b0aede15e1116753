#!/usr/bin/env bash
# GPU verification of a changed kernels/cuda source before its fatbins are
# embedded (written for the 192x192 wgmma tile, issue 13 pass 5; used as is
# for c108d65). On the GPU machine (nvcc, no Go), from
# the repository root, with the test binaries and moeprep cross-built here:
#     GPU_TEST_PKGS="internal/cuda kernels validate" scripts/gpu-test.sh build
#     CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#     run(command="bash scripts/wg/verify-192.sh", carry=[".gpu"], timeout_s=420)
# 1. scripts/gpu-test.sh run: builds every fatbin with scripts/build-kernels.sh
#    into kernels/build, runs the carried test binaries against them and puts
#    kernels-build.tgz (to embed: tar xzf kernels-build.tgz -C kernels/),
#    build-logs.tgz (ptxas: expect 128 registers, 0 spills for the _wg_
#    kernels), the logs and summary.txt into $OUT. TestBuildMatchesSources
#    fails there while the embedded build is older than the sources (then
#    kernels rc=1 and this script's exit status 1 come from it alone: read
#    the summary).
# 2. bench kernels, bf16, T = 1024 and 4096, on the same fresh fatbins
#    ($MOEPREP_KERNELS_DIR, kernels.KernelsDirEnv), --gemm-path wgmma and tall.
# Bounded: 200 s + 2 x 60 s. Exit status: non-zero when a step failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
out=${OUT:-/tmp/verify-192-out}
mkdir -p "$out"
for f in .gpu/internal_cuda.test .gpu/kernels.test .gpu/validate.test .gpu/moeprep; do
	[ -x "$f" ] || { echo "verify-192: $f missing (build it on the dev machine, carry .gpu)" >&2; exit 2; }
done
rc=0
echo "== gpu-test.sh run (fresh fatbins)"
GPU_TEST_PKGS="internal/cuda kernels validate" OUT=$out timeout 200 bash scripts/gpu-test.sh run || rc=1
grep -A4 "Compiling entry function '.*_wg_.*' for 'sm_90a'" /tmp/kernel-build-logs/grouped_gemm_wg.log 2>/dev/null |
	grep -E "Compiling|registers|spill" | head -8
for path in ${VERIFY_PATHS:-wgmma tall}; do
	echo "== bench kernels --gemm-path $path"
	MOEPREP_KERNELS_DIR=$root/kernels/build timeout 60 .gpu/moeprep bench kernels --dtype bf16 --tokens 1024,4096 \
		--budget 0.5s --gemm-path "$path" >"$out/bench_$path.txt" 2>"$out/bench_$path.log" || {
		rc=1
		echo "bench $path failed:"
		tail -5 "$out/bench_$path.log"
	}
	head -1 "$out/bench_$path.txt"
	grep -E ' (T|grouped_gemm|gemm_[a-z_]+|layer_graph) ' "$out/bench_$path.txt"
done
exit $rc
