#!/usr/bin/env bash
# On the GPU machine (it has torch and transformers; Go is not needed):
# convert every bf16 HF fixture with --layout gate-up using a cross-built
# moeprep, then prove transformers 5 loads the result and computes identical
# logits (fixtures/hf/interop.py). Prints one line per model and a summary.
#
# Here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
# There:  run(command="bash scripts/gpu-interop.sh", carry=[".gpu"])
set -uo pipefail
cd "$(dirname "$0")/.."
mp=${MOEPREP:-.gpu/moeprep}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
for name in deepseek-v3-bf16 deepseek-v2-lite mixtral qwen2-moe qwen3-moe; do
	src=fixtures/hf/$name
	dst=$work/$name-gate-up
	if ! "$mp" convert --layout gate-up --no-progress "$src" "$dst" >/dev/null; then
		echo "interop FAIL $name: convert failed"
		fail=$((fail + 1))
		continue
	fi
	if PYTHONUNBUFFERED=1 python3 fixtures/hf/interop.py "$src" "$dst" --expect-fused 2>"$work/err"; then
		pass=$((pass + 1))
	else
		tail -5 "$work/err"
		fail=$((fail + 1))
	fi
done
echo "interop: $pass passed, $fail failed"
[ "$fail" = 0 ]
