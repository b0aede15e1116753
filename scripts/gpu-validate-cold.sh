#!/usr/bin/env bash
# validate --device cuda against a cold cat of the same files, at real
# DeepSeek-V3 dims (issue 31): FP8 128x128, 256 experts + 1 shared, H 7168,
# I 2048, one dense and two MoE layers, `fuse-shared --tp 8`; SRC and DST
# both on disk (23.1 + 23.7 GB). On the GPU machine:
#
#   here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#           (and any builds to compare, e.g. .gpu/moeprep-base)
#   device: run(command="BINS='.gpu/moeprep .gpu/moeprep-base' ROUNDS=2 bash scripts/gpu-validate-cold.sh", carry=[".gpu"])
#
# Each round, in a rotated order: cat of every SRC and DST file, then
# `validate SRC DST --device cuda` (default checks: byte proof included,
# CPU reference on both layers) with each binary, the page cache emptied
# before every run (drop_caches when root may, else POSIX_FADV_DONTNEED on
# every file). Prints one line per run (seconds, ratio to the round's cat,
# peak RSS) and copies the reports and logs to $OUT. Extra arguments go to
# validate.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-validate-lib.sh
out=${OUT:-/tmp/gpu-validate-cold}
mkdir -p "$out"
read -r -a bins <<<"${BINS:-.gpu/moeprep}"
rounds=${ROUNDS:-1}
gen=$(pwd)/${bins[0]}
src=$(pwd)/.cold-src
dst=$(pwd)/.cold-dst
scratch "$src" "$dst"
gpu_setup
echo "== synth deepseek-v3-shaped fp8, 1 dense + 2 MoE layers -> $src"
t timeout 300 "$gen" fixture synth --preset deepseek-v3-shaped --dtype fp8 --num-layers 3 --dense-layers 1 --no-progress "$src" || exit 1
echo "== fuse-shared --tp 8 -> $dst"
t timeout 300 "$gen" fuse-shared --tp 8 --no-progress "$src" "$dst" || exit 1
du -sb "$src" "$dst"

# cold empties the page cache of both models.
cold() {
	sync
	if echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then return; fi
	uncache "$src" "$dst"
}
cold_how="drop_caches"
[ -w /proc/sys/vm/drop_caches ] || cold_how="posix_fadvise DONTNEED"
echo "cold cache by: $cold_how"

# run NAME CMD... times one cold run; prints "NAME seconds peak-rss-kb".
run() {
	local name=$1
	shift
	cold
	local s e
	s=$(date +%s.%N)
	if [ -x /usr/bin/time ]; then
		/usr/bin/time -f "%M" -o "$out/rss.tmp" timeout "${RUN_TIMEOUT:-300}" "$@"
	else
		echo - >"$out/rss.tmp"
		timeout "${RUN_TIMEOUT:-300}" "$@"
	fi
	local rc=$?
	e=$(date +%s.%N)
	echo "$name $(awk "BEGIN{printf \"%.2f\", $e - $s}") $(cat "$out/rss.tmp") rc=$rc" | tee -a "$out/times.txt"
}
for r in $(seq 1 "$rounds"); do
	order=(cat "${bins[@]}")
	# rotate: round r starts at entry (r-1) mod n
	n=${#order[@]}
	for k in $(seq 0 $((n - 1))); do
		w=${order[$(((k + r - 1) % n))]}
		if [ "$w" = cat ]; then
			run "r$r cat" bash -c 'find "$1" "$2" -type f -print0 | xargs -0 cat >/dev/null' _ "$src" "$dst"
		else
			tag=$(basename "$w")
			run "r$r $tag" "$(pwd)/$w" validate --device cuda --json -o "$out/report-$tag-r$r.json" "$@" "$src" "$dst" \
				2>"$out/progress-$tag-r$r.log" >/dev/null
			tail -3 "$out/progress-$tag-r$r.log"
		fi
	done
done
echo "== times (seconds, peak RSS KB)"
cat "$out/times.txt"
