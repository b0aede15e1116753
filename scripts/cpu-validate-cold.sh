#!/usr/bin/env bash
# Issue 45's CPU table: `moeprep validate SRC DST --device cpu` against
# `cat` of SRC's and DST's files, row by row, each row a synthesised
# checkpoint at a real model's dimensions and its converted copy (made once
# under WORK). Every run starts from the same page-cache state: each file of
# SRC and DST is dropped from the cache before it (posix_fadvise DONTNEED
# through dd's nocache flag, which needs no root; with DROP_CACHES=1, drop_caches as
# well), so cat and validate both read cold. Rounds rotate the order; the table gives the
# median of ROUNDS runs, its ratio to cat's median (x_cat), the median of
# the per-round ratios (paired), peak RSS, and the raw wall/user/sys.
#
#   scripts/cpu-validate-cold.sh [WORK] [ROUNDS] [ROWS...]
#   MOEPREP_BASE=/path/to/old/moeprep scripts/cpu-validate-cold.sh /work/cpu45 3 mixtral-bf16
#   DROP_CACHES=1 scripts/cpu-validate-cold.sh ...   # root, on a machine of one's own
#   CLEAN=1 scripts/cpu-validate-cold.sh ...   # remove each row's SRC and DST once measured
#   VALIDATE_ARGS=--bytes scripts/cpu-validate-cold.sh ...   # validate --bytes instead
#
# Rows (all of them when none is named): dsv3-fp8-64, dsv3-fp8-16,
# mixtral-bf16, kimi-int4-96, gptoss-mxfp4; tiny-mixtral is a smoke test of
# the script itself; qwen3-bf16 and qwen3-fp8 (Qwen3-30B-A3B's expert dims,
# 2 MoE layers, converted --layout gate-up: README's CI figures, 4.8 and
# 2.4 GB) only when named. SRC + DST of each (synthesised once under WORK, and
# kept unless CLEAN=1): dsv3-fp8-64 6.5 GB, dsv3-fp8-16 1.8 GB,
# mixtral-bf16 5.6 GB, kimi-int4-96 0.8 GB, gptoss-mxfp4 (MXFP4 experts
# stacked on disk, as gpt-oss ships them) about 3.5 GB: about 18 GB for all
# five, the largest row's 6.5 GB with CLEAN=1.
set -euo pipefail
work=${1:-/work/cpu45}
rounds=${2:-3}
shift $(($# < 2 ? $# : 2))
rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(dsv3-fp8-64 dsv3-fp8-16 mixtral-bf16 kimi-int4-96 gptoss-mxfp4)
cd "$(dirname "$0")/.."
# shellcheck source=bench-rounds.sh
source scripts/bench-rounds.sh
mkdir -p "$work"
bench_build

# make ROW: synthesise SRC and convert DST of ROW under WORK (once).
make_row() {
	local row=$1 src=$work/$1-src dst=$work/$1-dst
	local q3=(--family qwen3_moe --hidden 2048 --intermediate 768 --experts 128 --top-k 8 --num-layers 2)
	local ds=(--family deepseek_v3 --dtype fp8 --top-k 8 --hidden 7168 --intermediate 2048 --num-layers 1 --dense-layers 0)
	if [ ! -d "$src" ]; then
		case $row in
		dsv3-fp8-64) "$mp" fixture synth -q "${ds[@]}" --experts 64 "$src" ;;
		dsv3-fp8-16) "$mp" fixture synth -q "${ds[@]}" --experts 16 "$src" ;;
		mixtral-bf16) "$mp" fixture synth -q --family mixtral --experts 8 --top-k 2 --hidden 4096 --intermediate 14336 --num-layers 1 "$src" ;;
		kimi-int4-96) "$mp" fixture synth -q --preset small-kimi-k2-int4 --experts 96 --hidden 2048 --intermediate 1024 --num-layers 2 --dense-layers 1 "$src" ;;
		gptoss-mxfp4) "$mp" fixture synth -q --preset gpt-oss-shaped --dtype mxfp4 --num-layers 1 "$src" ;;
		tiny-mixtral) "$mp" fixture synth -q --preset tiny-mixtral "$src" ;;
		qwen3-bf16) "$mp" fixture synth -q "${q3[@]}" "$src" ;;
		qwen3-fp8) "$mp" fixture synth -q "${q3[@]}" --dtype fp8 "$src" ;;
		*) echo "unknown row $row" >&2; exit 2 ;;
		esac >&2
	fi
	if [ ! -d "$dst" ]; then
		case $row in
		dsv3-fp8-*) "$mp" fuse-shared -q --tp 8 "$src" "$dst" ;;
		kimi-int4-96) "$mp" fuse-shared -q --tp 8 --requantize-shared "$src" "$dst" ;;
		qwen3-*) "$mp" convert -q --layout gate-up "$src" "$dst" ;;
		*) "$mp" convert -q "$src" "$dst" ;;
		esac >&2
	fi
}

# uncache drops every file under the given directories from the page cache:
# each file's pages (dd's nocache flag: posix_fadvise DONTNEED, no root
# needed, nobody else's files touched), and with DROP_CACHES=1 (root, a
# machine of one's own) the whole cache as well.
uncache() {
	sync
	if [ "${DROP_CACHES:-0}" = 1 ]; then echo 3 >/proc/sys/vm/drop_caches; fi
	find -H "$@" -type f -exec dd if={} iflag=nocache count=0 status=none \;
}

# measure CMD...: "wall user sys peak_rss_MB" of CMD, SRC and DST uncached first.
measure() {
	uncache "$src" "$dst"
	/usr/bin/time -f "%e %U %S %M" -o "$work/time.txt" "$@" >/dev/null
	awk '{printf "%s %s %s %.0f\n", $1, $2, $3, $4/1024}' "$work/time.txt"
}


echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "page cache: dropped per file before every run (posix_fadvise)$([ "${DROP_CACHES:-0}" = 1 ] && echo ', and drop_caches')"
printf '%-14s %-14s %8s %6s %7s %7s   %s\n' row run median_s x_cat paired rss_MB "raw (wall/user/sys s per round)"
for row in "${rows[@]}"; do
	make_row "$row"
	src=$work/$row-src dst=$work/$row-dst
	mapfile -t files < <(find -H "$src" "$dst" -name '*.safetensors' | sort)
	runs=(cat validate)
	[ -n "$base" ] && runs+=(validate@base)
	BENCH_ROW=$row bench_rounds "$rounds" "${runs[@]}"
	if [ "${CLEAN:-0}" = 1 ]; then rm -rf "$src" "$dst"; fi
done
