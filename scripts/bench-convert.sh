#!/usr/bin/env bash
# Issue 3's benchmark: moeprep convert and fuse-shared against `cp -r` of the
# same synthetic DeepSeek-V3-shaped checkpoint (256 experts, H 7168, one dense
# and one MoE layer: FP8 with I 2048 is 11.6 GB; bf16 uses I 1024 to stay at
# 11.6 GB, since one bf16 layer at I 2048 is 22.5 GB and this disk holds two copies).
# ROUNDS rounds of (cp, convert, fuse-shared) run interleaved, each from a cold
# page cache when run as root; the table gives medians and peak RSS.
#
#   scripts/bench-convert.sh [WORK] [ROUNDS] [DTYPES]
#   scripts/bench-convert.sh /work/bench 3 "bf16 fp8"
set -euo pipefail
work=${1:-/work/bench}
rounds=${2:-3}
dtypes=${3:-bf16 fp8}
cd "$(dirname "$0")/.."
mkdir -p "$work"
go build -o "$work/moeprep" ./cmd/moeprep
mp="$work/moeprep"

# measure CMD...: prints "wall_seconds peak_rss_MB" of CMD
measure() {
	sync
	if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; fi
	/usr/bin/time -v -o "$work/time.txt" "$@" >"$work/out.txt"
	awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; w=s}
		/Maximum resident set size/ {r=$2/1024} END {printf "%.2f %.0f\n", w, r}' "$work/time.txt"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

printf '%-5s %-22s %8s %8s %7s %7s %7s\n' dtype run median_s GB/s x_cp rss_MB bytes_GB
for dt in $dtypes; do
	src="$work/src-$dt"
	rm -rf "$src"
	inter=2048
	[ "$dt" = bf16 ] && inter=1024
	"$mp" fixture synth --preset deepseek-v3-shaped --dtype "$dt" --layers 2 --intermediate "$inter" --no-progress "$src" >&2
	declare -A secs=() rss=() bytes=()
	for r in $(seq "$rounds"); do
		for run in cp convert fuse; do
			out="$work/out-$dt"
			rm -rf "$out" "$out.partial"
			case $run in
			cp) read -r s m < <(measure sh -c 'cp -r "$1" "$2" && sync' sh "$src" "$out") ;;
			convert) read -r s m < <(measure "$mp" convert --no-progress "$src" "$out") ;;
			fuse) read -r s m < <(measure "$mp" fuse-shared --tp 8 --no-progress "$src" "$out") ;;
			esac
			secs[$run]+="$s "
			rss[$run]=$(( ${rss[$run]:-0} > m ? ${rss[$run]:-0} : m ))
			bytes[$run]=$(du -sb "$out" | cut -f1)
			rm -rf "$out"
		done
	done
	cp_med=$(tr ' ' '\n' <<<"${secs[cp]}" | grep . | median)
	for run in cp convert fuse; do
		med=$(tr ' ' '\n' <<<"${secs[$run]}" | grep . | median)
		awk -v dt="$dt" -v n="$run" -v s="$med" -v c="$cp_med" -v m="${rss[$run]}" -v b="${bytes[$run]}" -v all="${secs[$run]}" \
			'BEGIN { printf "%-5s %-22s %8.2f %8.2f %7.2f %7s %7.2f   (runs: %s)\n", dt, n, s, b/s/1e9, s/c, m, b/1e9, all }'
	done
	rm -rf "$src"
done
