#!/usr/bin/env bash
# On the GPU machine: two sets of kernel fatbins under one moeprep binary,
# for a change to the CUDA sources that must not change what they compute
# (issue 28's common headers). The binary loads $MOEPREP_KERNELS_DIR's
# fatbins instead of its embedded ones, so everything but the kernels is
# the same code.
#   1. bench kernels --json with OLD and NEW fatbins for every weight dtype,
#      activation numerics and grouped GEMM path: the layer_outputs digests
#      (SHA-256 of the fused layer's whole output over seeded inputs, per
#      token count) must be equal.
#   2. bench kernels with the default path, OLD and NEW alternated over
#      ROUNDS rounds, for bf16, fp8 weights and w8a8: per kernel and token
#      count the new/old ratio of medians.
# Here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#         mkdir -p .gpu/kernels-old && git archive OLD_COMMIT kernels/build | tar x --strip-components=2 -C .gpu/kernels-old
# There:  run(command="bash scripts/gpu-compare-kernels.sh", carry=[".gpu"])
#         (NEW defaults to kernels/build of the tree; STEP=digest or STEP=time runs one half.)
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-.gpu/moeprep}
old=$(realpath "${OLD_KERNELS:-.gpu/kernels-old}") new=$(realpath "${NEW_KERNELS:-kernels/build}")
res=${OUT:-/tmp/compare-kernels-out}
rounds=${ROUNDS:-3}
# Every bench report goes to a work folder; $OUT gets one archive of them.
out=$(mktemp -d)
mkdir -p "$res"
trap 'tar czf "$res/compare-kernels.tgz" -C "$out" .' EXIT
for d in "$old" "$new"; do
	[ -f "$d/BUILD.json" ] || { echo "no BUILD.json in $d"; exit 2; }
done
echo "old fatbins: $old"
echo "new fatbins: $new"

digest() { # NAME ARGS...: bench with fatbin sets $A and $B (old, new), compare the digests
	local name=$1 a=${A:-old} b2=${B:-new}
	shift
	for b in old new; do
		local which=$a; [ $b = new ] && which=$b2
		MOEPREP_KERNELS_DIR=${!which} timeout 240 "$bin" bench kernels --quiet --json --no-graph --bank-copies 1 \
			--iters 5 --budget 10ms "$@" >"$out/digest-$name-$b.json" 2>"$out/digest-$name-$b.err" ||
			{ echo "digest $name $b: bench failed: $(tail -1 "$out/digest-$name-$b.err")"; return 1; }
	done
	python3 - "$out/digest-$name-old.json" "$out/digest-$name-new.json" "$name" <<'PY'
import json, sys
o, n, name = json.load(open(sys.argv[1]))["layer_outputs"], json.load(open(sys.argv[2]))["layer_outputs"], sys.argv[3]
ok = o == n and len(o) > 0
print(f"digest {name}: {'identical' if ok else 'DIFFERENT'} at T=" + ",".join(str(x["tokens"]) for x in n))
sys.exit(0 if ok else 1)
PY
}

if [ "${STEP:-digest}" != time ]; then
	same=0 diff=0
	cfgs=("bf16-auto:--dtype bf16 --tokens 1,16,128,1024,4096"
		"fp8-auto:--dtype fp8 --tokens 1,16,128,1024,4096"
		"w8a8-auto:--precision fp8 --tokens 1,16,128,1024,4096")
	for p in simt mma mma2 tall wgmma mma3; do cfgs+=("bf16-$p:--dtype bf16 --gemm-path $p --tokens 1,128,4096"); done
	for p in simt mma mma2 tall; do cfgs+=("fp8-$p:--dtype fp8 --gemm-path $p --tokens 1,128,4096"); done
	# The same fatbins twice: the digest is only evidence if a build
	# reproduces its own bits.
	A=old B=old digest "bf16-auto-old-twice" --dtype bf16 --tokens 1,128,4096 || echo "the old build does not reproduce its own output: digests prove nothing"
	for c in "${cfgs[@]}"; do
		# shellcheck disable=SC2086
		if digest "${c%%:*}" ${c#*:}; then same=$((same+1)); else diff=$((diff+1)); fi
	done
	echo "layer output digests: $same identical, $diff different"
fi

if [ "${STEP:-time}" != digest ]; then
	for r in $(seq "$rounds"); do
		for cfg in "--dtype bf16" "--dtype fp8" "--precision fp8"; do
			tag=$(echo "$cfg" | tr -d ' -')
			# Old first in odd rounds, new first in even ones.
			order="old new"; [ $((r % 2)) = 0 ] && order="new old"
			for b in $order; do
				# shellcheck disable=SC2086
				MOEPREP_KERNELS_DIR=${!b} timeout 200 "$bin" bench kernels --quiet --json $cfg --tokens 1,128,4096 \
					--budget 200ms >"$out/time-$tag-$b-$r.json" 2>/dev/null || echo "time $tag $b $r failed"
			done
		done
	done
	python3 - "$out" "$rounds" <<'PY'
import json, sys, statistics, os
out, rounds = sys.argv[1], int(sys.argv[2])
for tag in ("dtypebf16", "dtypefp8", "precisionfp8"):
    rows = {}
    for b in ("old", "new"):
        for r in range(1, rounds + 1):
            p = f"{out}/time-{tag}-{b}-{r}.json"
            if not os.path.exists(p) or os.path.getsize(p) == 0:
                continue
            for x in json.load(open(p))["rows"]:
                if x.get("us"):
                    rows.setdefault((x["kernel"], x["tokens"]), {"old": [], "new": []})[b].append(x["us"])
    worst = (0, "")
    for (k, t), d in sorted(rows.items()):
        if d["old"] and d["new"]:
            q = statistics.median(d["new"]) / statistics.median(d["old"])
            print(f"{tag} {k:12s} T={t:5d}: old {statistics.median(d['old']):9.1f} us  new {statistics.median(d['new']):9.1f} us  new/old {q:.3f}")
            if abs(q - 1) > worst[0]:
                worst = (abs(q - 1), f"{k} T={t}")
    print(f"{tag}: largest |new/old - 1| {worst[0]:.3f} ({worst[1]})")
PY
fi
