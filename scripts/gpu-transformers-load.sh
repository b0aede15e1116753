#!/usr/bin/env bash
# On the GPU machine (torch and transformers; Go is not needed): convert
# every fixture in fixtures/hf with --layout transformers using a
# cross-built moeprep, then load each original and its conversion with
# transformers (fixtures/hf/interop.py --table): identical parameters and
# logits, no missing, unexpected or mismatched key. Prints one row a
# fixture and a summary; a fixture convert refuses is its own row.
#
# Here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
# There:  MOEPREP=.gpu/moeprep bash scripts/gpu-transformers-load.sh [DETAILS_FILE]
set -uo pipefail
cd "$(dirname "$0")/.."
mp=${MOEPREP:-.gpu/moeprep}
details=${1:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
refused=0
: >"$work/pairs"
for cfg in fixtures/hf/*/config.json; do
	src=$(dirname "$cfg")
	name=$(basename "$src")
	dst=$work/$name
	if ! "$mp" convert --layout transformers -q "$src" "$dst" >/dev/null 2>"$work/err"; then
		echo "interop CONVERT  $name: $(head -c 300 "$work/err")"
		refused=$((refused + 1))
		continue
	fi
	echo "$name $src $dst" >>"$work/pairs"
done
echo "converted $(wc -l <"$work/pairs") fixtures with --layout transformers, $refused refused"
# Four parts side by side, each under its own time limit and with its own
# log, printed in order once all are done.
split -n l/4 -d "$work/pairs" "$work/part"
pids=()
for p in "$work"/part*; do
	extra=()
	[ -n "$details" ] && extra=(--details "$p.details")
	OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1 timeout 240 python3 fixtures/hf/interop.py --table "$p" "${extra[@]}" >"$p.log" 2>&1 &
	pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
	wait "$pid" || rc=1
done
for p in "$work"/part?? ; do
	grep -v "^interop summary" "$p.log" | grep "^interop \|Error\|Killed" || true
	[ -n "$details" ] && [ -f "$p.details" ] && cat "$p.details" >>"$details"
done
grep -h "^interop summary" "$work"/part??.log || echo "interop summary: missing (a part ran out of time?)"
[ "$rc" = 0 ] && [ "$refused" = 0 ]
