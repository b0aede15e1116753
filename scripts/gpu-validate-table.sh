#!/usr/bin/env bash
# Issue 45's GPU table at the issue's own sizes: validate --device cuda of
# one build against a cold cat of SRC and DST, with its peak RSS. The other
# GPU scripts run smaller versions at real per-expert dims; this one runs
# the rows as the issue measured them:
#   F  DeepSeek-V3 FP8 128x128, 1 dense + 2 MoE layers, 256 experts + 1
#      shared (23.1 GB); DST = fuse-shared --tp 8
#   K  Kimi-K2 INT4 group 32, 1 dense + 1 MoE layer, 384 experts + BF16
#      shared (9.9 GB); DST = fuse-shared --tp 8 --requantize-shared
#   G  gpt-oss MXFP4 (--preset gpt-oss-shaped), 4 MoE layers (6.8 GB); DST = convert
# ROWS picks them (default "K G F"), ROUNDS the rounds a row (default 2),
# each round {cat, validate} in turn order, the page cache dropped before
# every run (drop_caches, else posix_fadvise DONTNEED; only the latter in a
# dry run). A row's SRC and DST are removed before the next row is made: F
# alone takes 47 GB of disk.
# Run from the repository root on the GPU machine, the build cross-built:
#   BIN=.gpu/moeprep ROWS="K G" bash scripts/gpu-validate-table.sh OUTDIR
# DEV=cpu DIMS="--hidden 256 --intermediate 128 --experts 16" runs the same
# steps small on a machine without a GPU (a dry run of the script).
set -uo pipefail
# shellcheck source=gpu-validate-lib.sh
. scripts/gpu-validate-lib.sh || { echo "FAIL: run from the repository root"; exit 1; }
# Its files go to a new folder under OUTDIR, so a second run neither mixes
# its rounds with the first's nor overwrites a file it did not write.
mkdir -p "${1:-/tmp/gpu45table-out}" || exit 1
out=$(mktemp -d "${1:-/tmp/gpu45table-out}/table.XXXX") || exit 1
echo "writing to $out"
BIN=$(realpath "${BIN:?BIN=path of the moeprep to measure}")
ROWS=${ROWS:-K G F} ROUNDS=${ROUNDS:-2} DEV=${DEV:-cuda} DIMS=${DIMS:-}
gpu_setup
nproc
work=$(mktemp -d "$(pwd)/.gpu45table.XXXX") # its own folder: nothing it did not make is removed
trap 'rm -rf "$work"' EXIT
# cold drops the page cache: all of it on the GPU machine, only the row's
# files in a dry run (DIMS set: a shared machine's cache is not ours).
cold() {
	sync
	if [ -n "$DIMS" ]; then uncache "$@"; return; fi
	echo 3 2>/dev/null >/proc/sys/vm/drop_caches || uncache "$@"
}

# make_row NAME: synthesises the row's SRC and writes its DST under $work/NAME.
make_row() {
	local d=$work/$1
	case $1 in
	F) t timeout 400 "$BIN" fixture synth -q --preset deepseek-v3-shaped --dtype fp8 --num-layers 3 --dense-layers 1 $DIMS "$d/src" &&
		t timeout 300 "$BIN" fuse-shared -q --tp 8 "$d/src" "$d/dst" ;;
	K) t timeout 300 "$BIN" fixture synth -q --preset small-kimi-k2-int4 --experts 384 --hidden 7168 --intermediate 2048 --top-k 8 --num-layers 2 --dense-layers 1 $DIMS "$d/src" &&
		t timeout 200 "$BIN" fuse-shared -q --tp 8 --requantize-shared "$d/src" "$d/dst" ;;
	G) t timeout 200 "$BIN" fixture synth -q --preset gpt-oss-shaped --dtype mxfp4 --num-layers 4 $DIMS "$d/src" &&
		t timeout 200 "$BIN" convert -q "$d/src" "$d/dst" ;;
	esac
}

# run_one NAME WHAT ROUND: one cold run of cat or validate; prints
# "NAME WHAT rROUND seconds peak_rss_kb rc" and keeps validate's report and log.
run_one() {
	local d=$work/$1 s rc rss=-
	cold "$d/src" "$d/dst"
	s=$(date +%s.%N)
	if [ "$2" = cat ]; then
		timeout 200 bash -c 'find "$1" "$2" -type f -print0 | xargs -0 cat >/dev/null' _ "$d/src" "$d/dst"
		rc=$?
	else
		/usr/bin/time -v -o "$out/time-$1-r$3.txt" timeout 300 "$BIN" validate --device "$DEV" --json -o "$out/$1-r$3.json" "$d/src" "$d/dst" >/dev/null 2>"$out/$1-r$3.log"
		rc=$?
		rss=$(awk '/Maximum resident/ {print $NF}' "$out/time-$1-r$3.txt")
	fi
	echo "$1 $2 r$3 $(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $s}") $rss rc=$rc" | tee -a "$out/times.txt"
}

for row in $ROWS; do
	echo "== row $row (synth at $SECONDS s)"
	make_row "$row" || { echo "FAIL: make row $row"; rm -rf "${work:?}/$row"; continue; }
	du -sb "$work/$row/src" "$work/$row/dst" | awk '{printf "  %s %.2f GB\n", $2, $1/1e9}'
	for r in $(seq 1 "$ROUNDS"); do
		if [ $((r % 2)) = 1 ]; then run_one "$row" cat "$r"; run_one "$row" validate "$r"
		else run_one "$row" validate "$r"; run_one "$row" cat "$r"; fi
	done
	grep -h "one pass read\|checks passed\|FAIL" "$out/$row"-r*.log | sed 's/^/  /' | sort | uniq -c | head -8
	rm -rf "${work:?}/$row"
done
# Per row: validate / cat of each round, their median, and the peak RSS.
python3 - "$out/times.txt" <<'PY' | tee "$out/summary.txt"
import collections, json, os, statistics, sys
wall, rss = {}, collections.defaultdict(list)
for l in open(sys.argv[1]):
    row, what, r, s, kb, _ = l.split()
    wall[row, what, r] = float(s)
    if what == "validate" and kb != "-":
        rss[row].append(int(kb) // 1024)
for row in dict.fromkeys(k[0] for k in wall):
    q = sorted(wall[k] / wall[row, "cat", k[2]] for k in wall if k[0] == row and k[1] == "validate" and (row, "cat", k[2]) in wall)
    ok = []
    for k in wall:
        if k[0] == row and k[1] == "validate":
            try:
                ok.append(json.load(open(os.path.join(os.path.dirname(sys.argv[1]), f"{row}-{k[2]}.json")))["failed"] is False)
            except (OSError, ValueError, KeyError):
                ok.append(False)
    if q:
        print(f"row {row}: validate / cat {' '.join(f'{x:.2f}' for x in q)}, median {statistics.median(q):.2f}; peak RSS {' '.join(map(str, rss[row]))} MiB; reports passed {sum(ok)} of {len(ok)}")
PY
echo "done in $SECONDS s"
