#!/usr/bin/env bash
# Kernel benchmark on the GPU machine (issues 6 and 13): moeprep bf16 and fp8
# beside PyTorch eager and torch.compile, and beside grouped-GEMM engines built
# on torch._grouped_mm / torch._scaled_grouped_mm (bench/torch_ref.py), all in
# one run; the last table is moeprep's whole layer / the best peer per T.
#
# Here (no GPU needed):
#     CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
# Then through the device tool:
#     run(command="bash scripts/gpu-bench.sh", carry=[".gpu"], timeout_s=420)
# --quick times 2 token counts (16, 4096) with a smaller budget;
# GPU_BENCH_TOKENS=1,16,128 names the token counts instead.
# $OUT (or /tmp/gpu-bench-out) receives moeprep_{bf16,fp8,fp8-w8a8}.{json,log},
# torch.{json,log}, table.txt and device.txt. TORCH_COMPILE_MODE=reduce-overhead
# times torch.compile with CUDA graphs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-bench-out}
mkdir -p "$out"
bin=${MOEPREP_BIN:-.gpu/moeprep}
tokens=1,16,128,1024,4096 budget=1s tbudget=1.0 tloop=2.0
if [ "${1:-}" = --quick ]; then
	tokens=16,4096 budget=0.5s tbudget=0.5 tloop=1.0
fi
tokens=${GPU_BENCH_TOKENS:-$tokens} # e.g. GPU_BENCH_TOKENS=1,16,128: only the cells a change can move
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,power.draw,temperature.gpu \
	--format=csv | tee "$out/device.txt"
rc=0
# fp8-w8a8: fp8 weights with --precision fp8 (activations quantised to e4m3
# per token per 128 channels, as the fp8 peers run); fp8: bf16 activations.
for d in bf16 fp8 fp8-w8a8; do
	args=(--dtype "${d%%-*}")
	[ "$d" = fp8-w8a8 ] && args+=(--precision fp8)
	echo "== moeprep bench kernels ${args[*]} --tokens $tokens"
	start=$SECONDS
	if ! "$bin" bench kernels "${args[@]}" --tokens "$tokens" --budget "$budget" --json >"$out/moeprep_$d.json" 2>"$out/moeprep_$d.log"; then
		rc=1
		echo "moeprep $d failed:"
	fi
	grep -E 'copy bandwidth|T=.*(layer|grouped_gemm|gate |align)|failed|error' "$out/moeprep_$d.log" | tail -40
	echo "   ($((SECONDS - start)) s)"
done
echo "== torch reference"
start=$SECONDS
if ! PYTHONUNBUFFERED=1 python3 bench/torch_ref.py --tokens "$tokens" --budget "$tbudget" --loop-budget "$tloop" \
	--compile-mode "${TORCH_COMPILE_MODE:-default}" --json "$out/torch.json" >"$out/torch.log" 2>&1; then
	rc=1
	echo "torch_ref failed:"
	tail -30 "$out/torch.log"
fi
echo "   ($((SECONDS - start)) s)"
echo "== side by side"
python3 bench/compare.py "$out/moeprep_bf16.json" "$out/moeprep_fp8.json" "$out/moeprep_fp8-w8a8.json" "$out/torch.json" | tee "$out/table.txt"
exit $rc
