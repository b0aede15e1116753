#!/usr/bin/env bash
# Issue 45 Deliver 1, memory: validate --device cuda of two builds on the
# 4-bit rows, with where each run's memory goes. Synthesises its checkpoints.
# OLD and NEW against a cold cat of SRC and DST, default checks, rounds
# rotated over {cat, OLD, NEW}; per run the wall, the ratio to the round's
# cat, peak RSS (/usr/bin/time -v), the per-layer line, the memory at the
# peak by kind of mapping (scripts/rsswatch.py: the pass's huge-page O_DIRECT
# buffers, /dev/nvidia* and locked mappings, other anonymous (the Go heap,
# the driver's), files; pinned staging shows as RssShmem) and the Go heap
# (GODEBUG=gctrace=1). Rows, at real per-expert dims:
#   K  Kimi-K2 INT4 group 32: H 7168, I 2048, 128 experts + BF16 shared,
#      1 dense + 1 MoE layer; DST = fuse-shared --tp 8 --requantize-shared
#      (3 rounds; then NEW and OLD with --cpu-check none)
#   N  DeepSeek-V3 NVFP4, 128 experts, fuse-shared --tp 8 (1 round, time allowing)
#   G  gpt-oss MXFP4, 2 MoE layers, convert (2 rounds, time allowing)
# OLD and NEW reports compared without times. About 3 minutes on an H200.
# Run from the repository root (cross-built binaries; the machine needs python3):
#   OLD=path/moeprep-old NEW=path/moeprep bash scripts/gpu-validate-4bit-memory.sh OUTDIR
# DEV=cpu DIMS="--hidden 256 --intermediate 128" runs the same steps small on a
# machine without a GPU (the --cpu-check none runs then fail: a CPU run takes no --cpu-check).
set -uo pipefail
# shellcheck source=gpu-validate-lib.sh
. scripts/gpu-validate-lib.sh || { echo "FAIL: run from the repository root"; exit 1; }
out=${1:-/tmp/gpu45mem-out}
mkdir -p "$out"
OLD=${OLD:?OLD=path of the baseline moeprep} NEW=${NEW:?NEW=path of the moeprep to measure}
bin=$(mktemp -d /tmp/gpu45mem.XXXX)
cp scripts/rsswatch.py "$bin/" || { echo "FAIL: run from the repository root"; exit 1; }
DEV=${DEV:-cuda} DIMS=${DIMS:-}
export CUDA_MODULE_LOADING=EAGER
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc; free -g | sed -n 2p
echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
work=$(mktemp -d "$(pwd)/.gpu45mem.XXXX")
trap 'rm -rf "$work" "$bin"' EXIT
T0=$SECONDS

cold_how="drop_caches"
if [ -n "${DIMS:-}" ]; then cold_how="posix_fadvise DONTNEED" # a dry run on a shared machine
else sync; echo 3 2>/dev/null >/proc/sys/vm/drop_caches || cold_how="posix_fadvise DONTNEED"; fi
echo "cold cache by: $cold_how"
cold() {
	sync
	if [ "$cold_how" = drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; return; fi
	uncache "$@"
}


# same NAME ROUND: OLD's and NEW's reports of a round compared without what varies from run to run.
same() {
	report_norm "$out/$1-old-r$2.json" >"$out/o.norm" 2>/dev/null || echo bad-old >"$out/o.norm"
	report_norm "$out/$1-new-r$2.json" >"$out/n.norm" 2>/dev/null || echo bad-new >"$out/n.norm"
	if cmp -s "$out/o.norm" "$out/n.norm"; then echo "PASS: $1 r$2 reports identical"; else echo "FAIL: $1 r$2 reports differ"; diff <(tr ',' '\n' <"$out/o.norm") <(tr ',' '\n' <"$out/n.norm") | head -10; fi
}

# one NAME DIR WHO ROUND [extra validate flags]: a cold run; prints
# "NAME WHO rROUND seconds rss_kb rc", the run's per-layer lines and its
# memory at the peak.
one() {
	local name=$1 d=$2 who=$3 r=$4; shift 4
	cold "$d/src" "$d/dst"
	local s e rc tag=$name-$who-r$r
	s=$(date +%s.%N)
	if [ "$who" = cat ]; then
		/usr/bin/time -f "%M" -o "$out/rss.tmp" timeout 100 bash -c 'find "$1" "$2" -type f -print0 | xargs -0 cat >/dev/null' _ "$d/src" "$d/dst"
		rc=$?
	else
		local b=$NEW
		case $who in old*) b=$OLD ;; esac
		GODEBUG=gctrace=1 /usr/bin/time -v -o "$out/time-$tag.txt" timeout 100 "$b" validate --device "$DEV" --json -o "$out/$tag.json" "$@" "$d/src" "$d/dst" 2>"$out/$tag.log" >/dev/null &
		local p=$!
		python3 "$bin/rsswatch.py" $p "$out/mem-$tag" &
		local w=$!
		wait $p
		rc=$?
		wait $w
		grep "Maximum resident" "$out/time-$tag.txt" | awk '{print $NF}' >"$out/rss.tmp"
	fi
	e=$(date +%s.%N)
	echo "$name $who r$r $(awk "BEGIN{printf \"%.2f\", $e - $s}") $(tail -1 "$out/rss.tmp") rc=$rc" | tee -a "$out/times.txt"
	if [ "$who" != cat ]; then
		grep "^validate: layer [0-9]*: read+upload" "$out/$tag.log" | sed 's/^/    /'
		sed 's/^/    /' "$out/mem-$tag.txt" 2>/dev/null | grep -v "^     *[0-9]* *[0-9]* file " | head -22
		python3 - "$out/$tag.log" <<'PY'
import re, sys
start = goal = 0
n = 0
for l in open(sys.argv[1], errors="replace"):
    m = re.search(r"(\d+)->(\d+)->(\d+) MB, (\d+) MB goal", l)
    if m:
        n += 1
        start, goal = max(start, int(m.group(1))), max(goal, int(m.group(4)))
print(f"    Go heap (gctrace): {n} GCs, largest heap at a GC's start {start} MB, largest goal {goal} MB")
PY
	fi
}

echo "== synth K"
K=$work/K N=$work/N G=$work/G F=$work/F
t timeout 100 "$NEW" fixture synth -q --preset small-kimi-k2-int4 --experts 128 --hidden 7168 --intermediate 2048 --top-k 8 --num-layers 2 --dense-layers 1 $DIMS "$K/src" || echo "FAIL: synth K"
t timeout 100 "$NEW" fuse-shared -q --tp 8 --requantize-shared "$K/src" "$K/dst" >/dev/null || echo "FAIL: fuse K"
du -sb "$K"/* | sed 's/^/  /'
echo "synth done at $((SECONDS - T0))s"
for r in 1 2 3; do
	order=(cat old new)
	for k in 0 1 2; do one K "$K" "${order[$(((k + r - 1) % 3))]}" "$r"; done
	echo "  round $r done at $((SECONDS - T0))s"
done
echo "== K with --cpu-check none at $((SECONDS - T0))s"
one K "$K" new 4 --cpu-check none
one K "$K" old 4 --cpu-check none
for r in 1 2 3 4; do
	same K "$r"
done
rm -rf "$K"

row() { # NAME DIR FROM TO: rounds FROM..TO rotated over {cat, OLD, NEW}, reports compared
	local name=$1 d=$2 r k
	for r in $(seq "$3" "$4"); do
		local order=(cat old new)
		for k in 0 1 2; do one "$name" "$d" "${order[$(((k + r - 1) % 3))]}" "$r"; done
		same "$name" "$r"
	done
}
if [ $((SECONDS - T0)) -lt 120 ]; then
	echo "== N: NVFP4 at $((SECONDS - T0))s"
	t timeout 60 "$NEW" fixture synth -q --preset deepseek-v3-shaped --dtype nvfp4 --experts 128 --num-layers 2 --dense-layers 1 $DIMS "$N/src" || echo "FAIL: synth N"
	t timeout 60 "$NEW" fuse-shared -q --tp 8 "$N/src" "$N/dst" >/dev/null || echo "FAIL: fuse N"
	row N "$N" 1 1
	rm -rf "$N"
else
	echo "SKIP: N: out of time at $((SECONDS - T0))s"
fi
if [ $((SECONDS - T0)) -lt 175 ]; then
	echo "== G: gpt-oss MXFP4 at $((SECONDS - T0))s"
	t timeout 40 "$NEW" fixture synth -q --preset gpt-oss-shaped --dtype mxfp4 --num-layers 2 $DIMS "$G/src" || echo "FAIL: synth G"
	t timeout 40 "$NEW" convert -q "$G/src" "$G/dst" >/dev/null || echo "FAIL: convert G"
	row G "$G" 1 1
	if [ $((SECONDS - T0)) -lt 205 ]; then row G "$G" 2 2; fi
	rm -rf "$G"
else
	echo "SKIP: G: out of time at $((SECONDS - T0))s"
fi
echo "== results (ratio = validate / cat of the same round; medians over the rounds)"
python3 scripts/bench_table.py "$out/times.txt"
rm -f "$out"/*.norm "$out/rss.tmp"
(cd "$out" && tar -cJf logs.tar.xz *.log *.json time-*.txt 2>/dev/null && rm -f *.log *.json time-*.txt)
echo "== total $((SECONDS - T0))s"
