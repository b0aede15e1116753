#!/usr/bin/env bash
# One device call that checks changed kernel sources end to end before their
# fatbins are embedded (issue 13): build every fatbin fresh, run the
# side-by-side benchmark (scripts/gpu-bench.sh: bf16, fp8 w8a16, fp8 w8a8,
# and the torch / Triton peers) on those fatbins (GPU_CHECK_SKIP_BENCH=1
# skips it), then every GPU test on them, then the standalone wgmma and
# w8a8 harnesses. Each step has its own time limit,
# so one hang cannot eat the call. Here first:
#     GPU_TEST_PKGS="internal/cuda kernels validate" bash scripts/gpu-test.sh build
#     CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep && strip .gpu/*
#     run(command="bash scripts/gpu-check-all.sh", carry=[".gpu"], timeout_s=600)
# $OUT receives kernels-build.tgz (embed: tar xzf kernels-build.tgz -C kernels/),
# build-logs.tgz, bench.tgz (gpu-bench.sh's files), table.txt, tests.tgz
# (a log per test binary), summary.txt, harness.txt and harness_fp8.txt. TestBuildMatchesSources
# fails in this run whenever the sources changed (the binaries embed the old
# build): read summary.txt. Exit status: non-zero when any other step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-/tmp/gpu-check-all-out}
mkdir -p "$out"
rc=0
step() { echo "== $1 ($(date +%T))"; }

step "build every fatbin"
KERNEL_LOG_DIR=/tmp/kernel-build-logs timeout 200 bash scripts/build-kernels.sh kernels/build || rc=1
tar czf "$out/kernels-build.tgz" -C kernels build
tar czf "$out/build-logs.tgz" -C /tmp kernel-build-logs
grep -h -A4 "Compiling entry function '.*_wg_.*' for 'sm_90a'" /tmp/kernel-build-logs/grouped_gemm_wg*.log 2>/dev/null |
	grep -E "Compiling|registers|spill" | head -12
export MOEPREP_KERNELS_DIR=$root/kernels/build

if [ -z "${GPU_CHECK_SKIP_BENCH:-}" ]; then
	step "gpu-bench.sh on the fresh fatbins"
	mkdir -p /tmp/bench-out
	OUT=/tmp/bench-out timeout 240 bash scripts/gpu-bench.sh | tail -30 || rc=1
	cp /tmp/bench-out/table.txt "$out/table.txt" 2>/dev/null
	tar czf "$out/bench.tgz" -C /tmp bench-out
fi

step "GPU tests on the fresh fatbins"
mkdir -p /tmp/test-out
GPU_TEST_KERNELS=embedded GPU_TEST_PKGS="internal/cuda kernels validate" OUT=/tmp/test-out timeout 240 bash scripts/gpu-test.sh run >/tmp/test-out/run.log 2>&1
echo "gpu-test.sh rc=$? (kernels rc=1 from TestBuildMatchesSources alone is expected when sources changed)"
cp /tmp/test-out/summary.txt "$out/summary.txt" 2>/dev/null
cat /tmp/test-out/summary.txt 2>/dev/null
grep -h -- "--- FAIL" /tmp/test-out/*.log 2>/dev/null | head -20
tar czf "$out/tests.tgz" -C /tmp test-out

step "wgmma harness (scripts/wg/harness.cu, small shapes)"
{ timeout 90 nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/h scripts/wg/harness.cu -lcuda &&
	timeout 60 /tmp/h 0; } >"$out/harness.txt" 2>&1
echo "harness rc=$?"
tail -15 "$out/harness.txt"

step "w8a8 harness (scripts/wg/harness_fp8.cu, small shapes)"
{ timeout 90 nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/hf scripts/wg/harness_fp8.cu -lcuda &&
	timeout 90 /tmp/hf 0; } >"$out/harness_fp8.txt" 2>&1
echo "harness_fp8 rc=$?"
tail -15 "$out/harness_fp8.txt"
step done
exit $rc
