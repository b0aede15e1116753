#!/usr/bin/env bash
# Issue 10 on the GPU machine, in one call:
#  1. validate's GPU tests (coverage, mutation suite, correct conversions) on
#     the embedded kernels;
#  2. a DeepSeek-V3-shaped FP8 model with ONE MoE layer (256 experts, H 7168,
#     I 2048, top-8, groups 8/4) and its fuse-shared --tp 8, page cache warm;
#     a full validate (routed tokens plus forced tokens through every expert)
#     on the GPU with --io-baseline (reading and uploading the layer's bytes
#     once, same buffers, no compute), then the structural proof
#     (validate --bytes), then the same validate on the CPU pinned to 2 cores
#     (as the development machine has) against cat-ing the same files once.
#
#   here:   scripts/gpu-test.sh build   (GPU_TEST_PKGS=validate is enough)
#           CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#   device: run(command="bash scripts/gpu-validate-coverage.sh", carry=[".gpu"])
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-validate-lib.sh
root=$(pwd)
bin=$root/.gpu/moeprep
out=${OUT:-/tmp/gpu-validate-coverage}
mkdir -p "$out"
export CUDA_MODULE_LOADING=EAGER
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if [ "${SKIP_TESTS:-}" != 1 ]; then
	echo "== validate GPU tests (embedded kernels)"
	(cd validate && timeout 330 "$root/.gpu/validate.test" -test.v -test.timeout 320s -test.run "${GPU_TEST_RUN:-GPU}") >"$out/validate-gpu-tests.log" 2>&1
	echo "  -> rc=$? pass=$(grep -c -- '--- PASS' "$out/validate-gpu-tests.log") fail=$(grep -c -- '--- FAIL' "$out/validate-gpu-tests.log") skip=$(grep -c -- '--- SKIP' "$out/validate-gpu-tests.log")"
	grep -E -- '--- FAIL|panic' "$out/validate-gpu-tests.log" | head -20
	grep -E 'caught \(' "$out/validate-gpu-tests.log" | sed 's/^ */  /' | head -40
fi
src=/dev/shm/moeprep-cov-src
dst=$root/.cov-dst
scratch "$src" "$dst"
echo "== synth deepseek-v3-shaped fp8, 1 dense + 1 MoE layer -> $src"
t timeout 200 "$bin" fixture synth --preset deepseek-v3-shaped --dtype fp8 --num-layers 2 --dense-layers 1 --no-progress "$src" || exit 1
echo "== fuse-shared --tp 8 -> $dst"
t timeout 200 "$bin" fuse-shared --tp 8 --no-progress "$src" "$dst" || exit 1
du -sh "$src" "$dst"
echo "== warm the page cache, and the time to read every file once (cat, 1 core)"
t sh -c "find '$src' '$dst' -type f -exec cat {} + >/dev/null"
s0=$(date +%s%N)
find "$src" "$dst" -type f -exec cat {} + >/dev/null
echo "  cat all files once: $((($(date +%s%N) - s0) / 1000000)) ms ($(du -sb "$src" "$dst" | awk '{s+=$1} END {printf "%.2f", s/1e9}') GB)"
echo "== GPU: validate --device cuda --cpu-check none --tokens 64 --io-baseline --skip-bytes"
t timeout 200 "$bin" validate --device cuda --cpu-check none --tokens 64 --io-baseline --skip-bytes -o "$out/gpu.json" "$src" "$dst" 2>"$out/gpu-progress.log" | tee "$out/gpu.txt"
echo "== structural proof: validate --bytes"
t timeout 200 "$bin" validate --bytes -o "$out/bytes.json" "$src" "$dst" 2>"$out/bytes-progress.log" | tee "$out/bytes.txt"
echo "== CPU, 2 cores: validate --device cpu --tokens 64 --skip-bytes"
t timeout 240 env GOMAXPROCS=2 taskset -c 0,1 /usr/bin/time -v "$bin" validate --device cpu --tokens 64 --skip-bytes -o "$out/cpu.json" "$src" "$dst" 2>"$out/cpu-progress.log" | tee "$out/cpu.txt"
grep -E "Elapsed|Maximum resident" "$out/cpu-progress.log"
s0=$(date +%s%N)
taskset -c 0 sh -c "find '$src' '$dst' -type f -exec cat {} + >/dev/null"
echo "  cat all files once on core 0: $((($(date +%s%N) - s0) / 1000000)) ms"
