#!/usr/bin/env bash
# validate --device cuda on a synthetic DeepSeek-V3-shaped model (256 experts,
# H 7168, I 2048, top-8, groups 8/4; 3 layers: 1 dense + 2 MoE), on the GPU
# machine. Usage (one dtype per device call, each well under 10 minutes):
#
#   here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#   device: run(command="bash scripts/gpu-validate-synth.sh fp8", carry=[".gpu"])
#           run(command="bash scripts/gpu-validate-synth.sh bf16", carry=[".gpu"])
#
# SRC (~23 GB fp8, ~45 GB bf16) goes to /dev/shm, DST (a little larger:
# 256 + 8 experts per layer after fuse-shared --tp 8) to disk, so both fit
# a 64 GB disk and 128 GB of RAM. Prints the report and the timings, copies
# the report (JSON and table) and the logs to $OUT, and removes both models.
# Extra arguments go to validate (e.g. --layers 1).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-validate-lib.sh
dtype=${1:?usage: gpu-validate-synth.sh bf16|fp8 [validate flags...]}
shift
case "$dtype" in bf16 | fp8) ;; *) echo "dtype must be bf16 or fp8" >&2; exit 2 ;; esac
need_bin
out=${OUT:-/tmp/gpu-validate-synth}
mkdir -p "$out"
src=/dev/shm/moeprep-synth-$dtype
dst=$(pwd)/.synth-dst-$dtype
scratch "$src" "$dst"
gpu_setup
echo "== synth deepseek-v3-shaped --dtype $dtype --layers 3 -> $src"
t "$bin" fixture synth --preset deepseek-v3-shaped --dtype "$dtype" --num-layers 3 --dense-layers 1 --no-progress "$src" || exit 1
du -sh "$src"
echo "== fuse-shared --tp 8 -> $dst"
t "$bin" fuse-shared --tp 8 --no-progress "$src" "$dst" || exit 1
du -sh "$dst"
echo "== validate --device cuda --tokens 64 $*"
s=$SECONDS
"$bin" validate --device cuda --tokens 64 -o "$out/report-$dtype.json" "$@" "$src" "$dst" 2> >(tee "$out/progress-$dtype.log" >&2) | tee "$out/report-$dtype.txt"
rc=${PIPESTATUS[0]}
echo "  -> validate rc=$rc in $((SECONDS - s))s"
exit "$rc"
