#!/usr/bin/env bash
# validate --device cuda on per-rank outputs, end to end (issue 43): convert and fuse-shared write
# per-rank outputs of the transformers-written fixtures deepseek-v3-fp8, deepseek-v3-bf16, qwen3-moe and
# mixtral (EP 4 and 8, EP x MoE-TP 2, redundant slots by --slots and from recorded loads through
# `moeprep placement`, fuse-shared with a replica per rank); each is validated with --device cuda
# --cpu-check all (every layer recomposed from the ranks on the GPU, the CPU twin beside it) and must
# PASS; --layers, --precision f32 and --json, --device auto and a whole-model output too; one rank
# file corrupted must exit 1 naming the rank. One PASS/FAIL line a run; exit 1 if any failed.
#
#   here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#   device: run(command="bash scripts/gpu-rank-validate.sh", carry=[".gpu"])
set -uo pipefail
cd "$(dirname "$0")/.."
mp=$(realpath "${MOEPREP:-.gpu/moeprep}")
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
e2e() { # name command fixture [convert args...]
	local name=$1 cmd=$2 fx=$3
	shift 3
	if ! timeout 60 $mp $cmd --quiet "$@" fixtures/hf/$fx "$w/$name" >"$w/$name.conv" 2>&1; then
		fail "$name: $cmd $* failed: $(tail -2 "$w/$name.conv")"
		return
	fi
	local t=$(date +%s)
	timeout 120 $mp validate --quiet --device cuda --cpu-check all fixtures/hf/$fx "$w/$name" >"$w/$name.txt" 2>&1
	local rc=$?
	sed 's/^/    /' "$w/$name.txt"
	if [ $rc = 0 ] && grep -q '(cuda, replica' "$w/$name.txt" && grep -q '(cpu, replica' "$w/$name.txt" && ! grep -q FAIL "$w/$name.txt"; then
		pass "$name: validate --device cuda ($(( $(date +%s) - t )) s)"
	else
		fail "$name: validate --device cuda rc=$rc"
	fi
}
e2e dsv3fp8-ep4 convert deepseek-v3-fp8 --ep 4
e2e dsv3fp8-ep8 convert deepseek-v3-fp8 --ep 8
e2e dsv3fp8-fuse-ep4-slots20 fuse-shared deepseek-v3-fp8 --ep 4 --slots 20
e2e dsv3bf16-fuse-ep2-tp2 fuse-shared deepseek-v3-bf16 --ep 2 --moe-tp 2
e2e dsv3bf16-ep4-slots20 convert deepseek-v3-bf16 --ep 4 --slots 20
e2e qwen3-ep2-tp2 convert qwen3-moe --ep 2 --moe-tp 2
e2e qwen3-ep4-slots12 convert qwen3-moe --ep 4 --slots 12
e2e mixtral-ep2-tp2 convert mixtral --ep 2 --moe-tp 2
e2e mixtral-ep4-slots12 convert mixtral --ep 4 --slots 12

# redundant slots placed from recorded loads (moeprep placement), fuse-shared with a replica per rank
cat >"$w/loads.json" <<'JSON'
{"logical_count": [[0, 0, 0, 0, 0, 0, 0, 0], [100, 1, 1, 1, 1, 1, 1, 50], [1, 1, 1, 1, 1, 1, 90, 1]]}
JSON
if timeout 30 $mp placement "$w/loads.json" --ep 2 --slots 10 --json >"$w/placement.json"; then
	e2e qwen3-placed-ep2-slots10 convert qwen3-moe --ep 2 --placement-map "$w/placement.json"
	e2e qwen3-placed-ep2-tp2-slots10 convert qwen3-moe --ep 2 --moe-tp 2 --placement-map "$w/placement.json"
else
	fail "moeprep placement"
fi
e2e dsv3fp8-fuse-ep8 fuse-shared deepseek-v3-fp8 --ep 8

# --layers, --precision f32, --json; --device auto picks the GPU
out=$(timeout 60 $mp validate --quiet --json --device cuda --precision f32 --layers 2 fixtures/hf/qwen3-moe "$w/qwen3-ep2-tp2")
rc=$?
summary=$(echo "$out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(d.get("device"), d.get("layer_selection"), d.get("layers_recomposed"), d.get("layers_not_recomposed"),
      [(r["device"], r["layer"], r["replica"], r["rel_l2"], r["tolerance"]) for r in d.get("recomposed", [])])')
echo "    $summary"
if [ $rc = 0 ] && [ "${summary%% \[(*}" = "cuda 2 [2] [1]" ]; then
	pass "--layers 2 --precision f32 --json"
else
	fail "--layers 2 --precision f32 --json rc=$rc"
fi
out=$(timeout 60 $mp validate --quiet fixtures/hf/mixtral "$w/mixtral-ep2-tp2" 2>&1)
rc=$?
echo "$out" | sed 's/^/    /'
[ $rc = 0 ] && echo "$out" | grep -q '(cuda, replica' && pass "--device auto takes the GPU" || fail "--device auto rc=$rc"

# a whole-model output still validates on the GPU as before
if timeout 60 $mp convert --quiet fixtures/hf/qwen3-moe "$w/whole" >/dev/null 2>&1 && timeout 120 $mp validate --quiet --device cuda fixtures/hf/qwen3-moe "$w/whole" >"$w/whole.txt" 2>&1; then
	pass "whole-model validate --device cuda: $(tail -1 "$w/whole.txt")"
else
	fail "whole-model validate --device cuda: $(tail -3 "$w/whole.txt")"
fi

# mutation: one byte of rank 2's file flipped -> exit 1 naming rank 2
cp -r "$w/dsv3fp8-fuse-ep4-slots20" "$w/mut"
f=$(ls "$w"/mut/rank-00002-of-00004/*.safetensors | head -1)
python3 - "$f" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[-9] ^= 0x10; open(p, 'wb').write(b)
PY
timeout 120 $mp validate --quiet --device cuda fixtures/hf/deepseek-v3-fp8 "$w/mut" >"$w/mut.txt" 2>&1
rc=$?
sed 's/^/    /' "$w/mut.txt"
[ $rc = 1 ] && grep -q 'rank 2' "$w/mut.txt" && pass "corrupted rank-2 file: exit 1 naming rank 2" || fail "corrupted rank-2 file: rc=$rc (want 1 naming rank 2)"

echo "gpu-rank-validate: $fails failed"
[ "$fails" = 0 ]
