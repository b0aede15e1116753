#!/usr/bin/env bash
# Issue 45 Deliver 1 on the GPU: validate --device cuda
# against a cold cat of SRC and DST, OLD (main dcd9364) and NEW (this
# branch), on smaller versions of the GPU table's three 4-bit checkpoints,
# at real per-expert dims:
#   K  Kimi-K2 INT4 group 32: H 7168, I 2048, 128 experts (of 384) + BF16
#      shared, 1 dense + 1 MoE layer; DST = fuse-shared --tp 8 --requantize-shared
#   G  gpt-oss MXFP4 (--preset gpt-oss-shaped --dtype mxfp4), 2 MoE layers; DST = convert
#   N  DeepSeek-V3 NVFP4: H 7168, I 2048, 128 experts + 1 shared, 1 dense +
#      1 MoE layer; DST = fuse-shared --tp 8
# Per checkpoint, 2 rounds in rotated order of {cat, OLD, NEW}, the page
# cache dropped before each (drop_caches, else fadvise DONTNEED); ratio to
# the round's cat; peak RSS from /usr/bin/time -v; OLD and NEW reports
# compared without times. Then NEW once with --cpu-check none (disk vs the
# CPU reference), the GPU read-once test, and gpu-compare-builds STEP=validate.
# Run from the repository root.
set -uo pipefail
# OLD and NEW: the two moeprep builds (cross-built, their paths), VALIDATE_TEST: NEW's validate test
# binary (for the read-once test; optional). Example, on the GPU machine:
#   OLD=.gpu/moeprep-old NEW=.gpu/moeprep VALIDATE_TEST=.gpu/validate.test bash scripts/gpu-validate-4bit-cold.sh
bin=$(mktemp -d /tmp/gpu45bin.XXXX)
OLD=${OLD:?OLD=path of the baseline moeprep} NEW=${NEW:?NEW=path of the moeprep to measure}
cp "${VALIDATE_TEST:-/dev/null}" "$bin/validate.test" 2>/dev/null; chmod +x "$bin/validate.test" 2>/dev/null
. scripts/gpu-validate-lib.sh
gpu_setup
nproc
out=${OUT:-/tmp/gpu45-out}
mkdir -p "$out"
work=$(mktemp -d "$(pwd)/.gpu45.XXXX") # its own folder: nothing it did not make is removed
trap 'rm -rf "$work" "$bin"' EXIT
T0=$SECONDS

cold_how="drop_caches"
sync; echo 3 2>/dev/null >/proc/sys/vm/drop_caches || cold_how="posix_fadvise DONTNEED"
echo "cold cache by: $cold_how"
cold() {
	sync
	if [ "$cold_how" = drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; return; fi
	uncache "$@"
}

echo "== synth (NEW's synth; synth is the same code in both builds)"
K=$work/K N=$work/N G=$work/G
t timeout 240 "$NEW" fixture synth -q --preset small-kimi-k2-int4 --experts 128 --hidden 7168 --intermediate 2048 --top-k 8 --num-layers 2 --dense-layers 1 "$K/src" || echo "FAIL: synth K"
t timeout 240 "$NEW" fuse-shared -q --tp 8 --requantize-shared "$K/src" "$K/dst" >/dev/null || echo "FAIL: fuse K"
t timeout 240 "$NEW" fixture synth -q --preset gpt-oss-shaped --dtype mxfp4 --num-layers 2 "$G/src" || echo "FAIL: synth G"
t timeout 240 "$NEW" convert -q "$G/src" "$G/dst" >/dev/null || echo "FAIL: convert G"
t timeout 240 "$NEW" fixture synth -q --preset deepseek-v3-shaped --dtype nvfp4 --experts 128 --num-layers 2 --dense-layers 1 "$N/src" || echo "FAIL: synth N"
t timeout 240 "$NEW" fuse-shared -q --tp 8 "$N/src" "$N/dst" >/dev/null || echo "FAIL: fuse N"
du -sb "$K"/* "$G"/* "$N"/* | sed 's/^/  /'
echo "synth done at $((SECONDS - T0))s"


# one NAME DIR WHO ROUND [extra validate flags]: a cold run; prints
# "NAME WHO rROUND seconds rss_kb rc".
one() {
	local name=$1 d=$2 who=$3 r=$4; shift 4
	cold "$d/src" "$d/dst"
	local s e rc
	s=$(date +%s.%N)
	if [ "$who" = cat ]; then
		/usr/bin/time -f "%M" -o "$out/rss.tmp" timeout 240 bash -c 'find "$1" "$2" -type f -print0 | xargs -0 cat >/dev/null' _ "$d/src" "$d/dst"
		rc=$?
	else
		local b=$OLD; [ "$who" = new ] && b=$NEW
		/usr/bin/time -f "%M" -o "$out/rss.tmp" timeout 240 "$b" validate --device cuda --json -o "$out/$name-$who-r$r.json" "$@" "$d/src" "$d/dst" 2>"$out/$name-$who-r$r.log" >/dev/null
		rc=$?
	fi
	e=$(date +%s.%N)
	echo "$name $who r$r $(awk "BEGIN{printf \"%.2f\", $e - $s}") $(tail -1 "$out/rss.tmp") rc=$rc" | tee -a "$out/times.txt"
	if [ "$who" != cat ]; then grep -E "^validate: layer [0-9]+: " "$out/$name-$who-r$r.log" | sed 's/^/    /'; fi
}
for r in 1 2; do
	for name in K G N; do
		d=${!name}
		order=(cat old new)
		for k in 0 1 2; do one "$name" "$d" "${order[$(((k + r - 1) % 3))]}" "$r"; done
		[ $r = 1 ] && echo "  at $((SECONDS - T0))s"
	done
done
echo "== NEW with --cpu-check none (the disk alone, no CPU reference)"
for name in K G N; do one "$name" "${!name}" new 3 --cpu-check none; done
echo "== results (median of 2 rounds; ratio = validate / cat of the same round)"
python3 scripts/bench_table.py "$out/times.txt" 1.2
echo "== OLD vs NEW reports (times left out)"
for name in K G N; do for r in 1 2; do
	report_norm "$out/$name-old-r$r.json" >"$out/o.norm" 2>/dev/null || echo bad-old >"$out/o.norm"
	report_norm "$out/$name-new-r$r.json" >"$out/n.norm" 2>/dev/null || echo bad-new >"$out/n.norm"
	if cmp -s "$out/o.norm" "$out/n.norm"; then echo "PASS: $name r$r reports identical"; else echo "FAIL: $name r$r reports differ"; diff <(tr ',' '\n' <"$out/o.norm") <(tr ',' '\n' <"$out/n.norm") | head -10; fi
done; done
rm -rf "$work"
echo "== GPU read-once and streamed-pass tests (NEW's validate tests) at $((SECONDS - T0))s"
(cd validate && timeout 240 "$bin/validate.test" -test.run 'TestGPUStreamedPassReadsEachByteOnce' -test.v 2>&1 | grep -E "^(--- |ok|PASS|FAIL)|read SRC|bytes read" | grep -v "^    --- PASS" | tail -40)
echo "== gpu-compare-builds STEP=validate at $((SECONDS - T0))s"
OLD=$OLD NEW=$NEW STEP=validate OUT=$out/compare timeout 150 bash scripts/gpu-compare-builds.sh 2>&1 | tail -25
echo "== total $((SECONDS - T0))s"
