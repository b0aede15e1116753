#!/usr/bin/env bash
# On the GPU machine: two builds of moeprep side by side in one run, for a
# refactor that must not change what the GPU computes (issue 28).
#   1. validate --device cuda --json of the same DST with OLD and NEW, in
#      every precision, over fixtures that exercise fused shared slots,
#      FP8 scales, expert biases (gpt-oss), input-scaled routing (Llama 4),
#      router-weighted shared experts (Inkling) and a gated shared expert
#      (Qwen2-MoE): every value of the two reports must be equal (times
#      and the tool's version left out).
#   2. bench kernels of both builds alternated (old, new, old, new) for bf16,
#      fp8 weights and w8a8: per kernel and token count the new/old ratio of
#      medians, and the experts-touched counts, which must be equal.
# Here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep-old ./cmd/moeprep  (at the old commit)
#         CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep-new ./cmd/moeprep
# There:  run(command="bash scripts/gpu-compare-builds.sh", carry=[".gpu"])
#         (STEP=validate compares the validate reports only.)
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-validate-lib.sh
old=${OLD:-.gpu/moeprep-old} new=${NEW:-.gpu/moeprep-new}
out=${OUT:-/tmp/compare-out}
work=$(mktemp -d)
mkdir -p "$out"
same=0 diff=0
for f in deepseek-v3-fp8:fuse deepseek-v3-bf16:fuse gpt-oss:convert llama4-text:convert inkling-text:convert qwen2-moe:convert glm4-moe-fp8:fuse; do
	name=${f%%:*} how=${f##*:}
	src=fixtures/hf/$name dst=$work/$name
	if [ "$how" = fuse ]; then "$new" fuse-shared -q --tp 2 "$src" "$dst" >/dev/null; else "$new" convert -q "$src" "$dst" >/dev/null; fi || { echo "$name: convert failed"; diff=$((diff+1)); continue; }
	precs="bf16 f32"; case $name in *fp8*) precs="bf16 f32 fp8";; esac
	for p in $precs; do
		for b in old new; do
			timeout 120 "${!b}" validate -q --device cuda --precision "$p" --cpu-check all --json "$src" "$dst" >"$work/$b.json" 2>"$work/$b.err"
			echo $? >"$work/$b.rc"
			report_norm "$work/$b.json" >"$work/$b.norm" 2>/dev/null || echo bad >"$work/$b.norm"
		done
		if cmp -s "$work/old.norm" "$work/new.norm" && cmp -s "$work/old.rc" "$work/new.rc"; then
			same=$((same+1)); echo "validate $name $p: identical (exit $(cat "$work/new.rc"))"
		else
			diff=$((diff+1)); echo "validate $name $p: DIFFERENT"; cp "$work/old.norm" "$out/$name-$p-old.json"; cp "$work/new.norm" "$out/$name-$p-new.json"
		fi
	done
done
echo "validate reports: $same identical, $diff different"
# STEP=validate stops here (the reports alone).
[ "${STEP:-}" = validate ] && exit $((diff > 0))
for cfg in "--dtype bf16" "--dtype fp8" "--precision fp8"; do
	tag=$(echo "$cfg" | tr -d ' -')
	for r in 1 2; do for b in old new; do
		timeout 150 "${!b}" bench kernels --quiet $cfg --tokens 1,128,4096 --budget 300ms --json >"$out/bench-$tag-$b-$r.json" 2>/dev/null || echo "bench $tag $b $r failed"
	done; done
done
python3 - "$out" <<'PY'
import json,sys,statistics,glob,os
out=sys.argv[1]
for tag in ("dtypebf16","dtypefp8","precisionfp8"):
    rows={}
    for b in ("old","new"):
        for r in (1,2):
            p=f"{out}/bench-{tag}-{b}-{r}.json"
            if not os.path.exists(p) or os.path.getsize(p)==0: continue
            for x in json.load(open(p))["rows"]:
                d=rows.setdefault((x["kernel"],x["tokens"]),{"old":[],"new":[],"touched":set()})
                d[b].append(x["us"]); d["touched"].add(round(x.get("touched_experts",0),6))
    worst=0
    for (k,t),d in sorted(rows.items()):
        if d["old"] and d["new"]:
            q=statistics.median(d["new"])/statistics.median(d["old"])
            if k=="layer_graph": print(f"{tag} {k} T={t}: new/old {q:.3f}")
            worst=max(worst,abs(q-1))
        if len(d["touched"])>1: print(f"{tag} {k} T={t}: experts touched differ {d['touched']}")
    print(f"{tag}: largest |new/old - 1| over kernels {worst:.3f}")
PY
