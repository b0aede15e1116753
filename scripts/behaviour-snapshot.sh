#!/usr/bin/env bash
# What moeprep computes, over every fixture, as one text file: the SHA-256
# of every file convert (three layouts) and fuse-shared (--tp 2, and --tp 1
# --fold-scaling down) write for each checkpoint of fixtures/hf and each
# tiny synth preset, and every value of the CPU validate report of each
# output (wall times, paths and the tool's version left out). A refactor
# (issue 28) must leave it byte-identical:
#
#   scripts/behaviour-snapshot.sh /tmp/before.txt      # on the old commit
#   scripts/behaviour-snapshot.sh /tmp/after.txt       # on the new one
#   diff /tmp/before.txt /tmp/after.txt                # nothing
#
# Needs Go and python3; about two minutes on two cores.
set -euo pipefail
out=${1:?usage: behaviour-snapshot.sh OUT.txt}
out=$(realpath -m "$out")
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mp=$work/moeprep
# A fixed version: the contract records the tool, and the build's own
# version would differ between the two commits.
go build -ldflags "-X main.version=snapshot" -o "$mp" ./cmd/moeprep

mkdir -p "$work/out" "$work/synth"
srcs=()
for d in fixtures/hf/*/; do
	[ -f "$d/config.json" ] && srcs+=("${d%/}")
done
for p in $("$mp" fixture synth --help | python3 -c 'import re,sys; print(" ".join(sorted(set(re.findall(r"tiny-[a-z0-9-]+", sys.stdin.read())))))'); do
	"$mp" fixture synth -q --preset "$p" "$work/synth/$p" >/dev/null
	srcs+=("$work/synth/$p")
done

normalise() { # a validate --json report without what varies between runs
	python3 -c '
import json, re, sys
drop = {"tool", "seconds", "src", "dst", "golden", "wall_s", "io_s", "compute_s"}
def walk(v):
    if isinstance(v, dict):
        return {k: walk(x) for k, x in sorted(v.items()) if k not in drop and not k.endswith("_seconds")}
    if isinstance(v, list):
        return [walk(x) for x in v]
    if isinstance(v, str):  # a summary line says how long the run took
        return re.sub(r"in [0-9.]+ ?(m?s|h)\b", "in T", v)
    return v
print(json.dumps(walk(json.load(sys.stdin)), sort_keys=True))'
}

{
	for src in "${srcs[@]}"; do
		name=$(basename "$src")
		runs=("convert --layout stacked" "convert --layout gate-up" "convert --layout up-gate"
			"fuse-shared --tp 2" "fuse-shared --tp 1 --fold-scaling down")
		for r in "${runs[@]}"; do
			dst=$work/out/$name-${r// /_}
			echo "== $name: $r"
			if ! "$mp" $r -q "$src" "$dst" >/dev/null 2>"$work/err"; then
				sed "s|$work|WORK|g; s|$PWD/||g" "$work/err"
				continue
			fi
			(cd "$dst" && find . -type f | LC_ALL=C sort | xargs sha256sum)
			"$mp" validate -q --device cpu --json "$src" "$dst" 2>/dev/null | normalise || echo "validate exit $?"
			rm -rf "$dst"
		done
	done
} >"$out"
echo "wrote $out: $(grep -c '^== ' "$out") runs"
