#!/usr/bin/env bash
# Issue 31's CPU benchmark: `moeprep validate SRC DST --device cpu` (layer
# checks and byte proof) against `cat` of SRC's and DST's weight files, each
# run from a cold page cache (sync, then drop_caches: run as root), in
# rounds whose order rotates; the table gives each run's median, its ratio
# to cat's median (x_cat), the median of the per-round ratios to that
# round's cat (paired: the shared disk's speed drifts over minutes), peak
# RSS, and every raw wall/user/sys figure.
#
# The model is issue 31's: a 1.6 GB DeepSeek-V3-shaped bf16 checkpoint (64
# experts, H 2048, I 1024, 2 MoE layers) and its fuse-shared --tp 8 output,
# made once under WORK.
#
#   sudo scripts/bench-validate.sh [WORK] [ROUNDS]
#   MOEPREP_BASE=/path/to/old/moeprep sudo scripts/bench-validate.sh /work/bench 3   # an older build beside
set -euo pipefail
work=${1:-/work/bench}
rounds=${2:-3}
cd "$(dirname "$0")/.."
# shellcheck source=bench-rounds.sh
source scripts/bench-rounds.sh
mkdir -p "$work"
bench_build
[ -w /proc/sys/vm/drop_caches ] || echo "warning: not root, page cache not dropped: figures are warm" >&2
src=$work/v31-src dst=$work/v31-dst
if [ ! -d "$src" ]; then
	"$mp" fixture synth -q --family deepseek_v3 --experts 64 --hidden 2048 --intermediate 1024 --num-layers 2 --dense-layers 0 "$src" >&2
fi
if [ ! -d "$dst" ]; then
	"$mp" fuse-shared -q --tp 8 "$src" "$dst" >&2
fi
files=("$src"/*.safetensors "$dst"/*.safetensors)

# measure CMD...: "wall user sys peak_rss_MB" of CMD from a cold cache
measure() {
	sync
	if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; fi
	/usr/bin/time -f "%e %U %S %M" -o "$work/time.txt" "$@" >/dev/null
	awk '{printf "%s %s %s %.0f\n", $1, $2, $3, $4/1024}' "$work/time.txt"
}
runs=(cat validate)
[ -n "$base" ] && runs+=(validate@base)
measure cat "${files[@]}" >/dev/null # warm-up, discarded: the VM's first run faults its memory back
printf '%-14s %8s %6s %7s %7s   %s\n' run median_s x_cat paired rss_MB "raw (wall/user/sys s per round)"
bench_rounds "$rounds" "${runs[@]}"
