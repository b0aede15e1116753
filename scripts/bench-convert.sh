#!/usr/bin/env bash
# Benchmark of issue 3: convert and fuse-shared against `cp -r` of the same
# synthetic DeepSeek-V3-shaped checkpoint (bf16 and FP8, >= 8 GB each), with
# peak RSS from /usr/bin/time -v. Needs about 4x GB free per dtype under WORK.
#
#   scripts/bench-convert.sh [WORK] [GB] [DTYPES]
#   scripts/bench-convert.sh /work/bench 8 "bf16 fp8"
set -euo pipefail
work=${1:-/work/bench}
gb=${2:-8}
dtypes=${3:-bf16 fp8}
cd "$(dirname "$0")/.."
mkdir -p "$work"
go build -o "$work/benchgen" ./convert/internal/benchgen

# measure LABEL CMD...: wall seconds and peak RSS (MB) of CMD
measure() {
	local label=$1
	shift
	sync
	/usr/bin/time -v -o "$work/time.txt" "$@" >"$work/out.txt"
	local wall rss
	wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$work/time.txt")
	rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2/1024}' "$work/time.txt")
	echo "$label $wall $rss"
}

printf '%-6s %-28s %9s %9s %8s %8s\n' dtype run seconds GB/s x_cp rss_MB
for dt in $dtypes; do
	src="$work/src-$dt"
	rm -rf "$src" "$work/cp-$dt" "$work/conv-$dt" "$work/fuse-$dt"
	"$work/benchgen" gen -dir "$src" -dtype "$dt" -gb "$gb" >&2
	bytes=$(du -sb "$src" | cut -f1)
	# cp gets a final sync: moeprep fsyncs every file it writes
	read -r _ cp_s cp_rss < <(measure cp sh -c 'cp -r "$1" "$2" && sync' sh "$src" "$work/cp-$dt")
	rm -rf "$work/cp-$dt"
	read -r _ cv_s cv_rss < <(measure convert "$work/benchgen" convert -src "$src" -dst "$work/conv-$dt")
	cv_b=$(du -sb "$work/conv-$dt" | cut -f1)
	rm -rf "$work/conv-$dt"
	read -r _ fs_s fs_rss < <(measure fuse "$work/benchgen" convert -src "$src" -dst "$work/fuse-$dt" -fuse -tp 8)
	fs_b=$(du -sb "$work/fuse-$dt" | cut -f1)
	rm -rf "$work/fuse-$dt"
	# GB/s is bytes written per second (fuse-shared writes 7 extra shared copies per layer)
	for r in "cp-r+sync $cp_s $cp_rss $bytes" "convert-stacked $cv_s $cv_rss $cv_b" "fuse-shared-tp8 $fs_s $fs_rss $fs_b"; do
		set -- $r
		awk -v dt="$dt" -v n="$1" -v s="$2" -v rss="$3" -v b="$4" -v c="$cp_s" \
			'BEGIN { printf "%-6s %-28s %9.2f %9.2f %8.2f %8s\n", dt, n, s, b/s/1e9, s/c, rss }'
	done
	rm -rf "$src"
done
