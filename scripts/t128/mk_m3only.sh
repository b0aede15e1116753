#!/usr/bin/env bash
# Writes the mma3 kernels of kernels/cuda/grouped_gemm.cu and the helpers they
# use, copied line for line, to $1: a file that compiles in seconds, for
# timing variants of them (-D M3_...) without the rest of the family.
set -euo pipefail
f=$(dirname "$0")/../../kernels/cuda/grouped_gemm.cu
first=$(grep -n '^// Pipelined variant of mma2' "$f" | cut -d: -f1)
mma=$(grep -n '^__device__ __forceinline__ void mma_bf16_16816' "$f" | cut -d: -f1)
{
	grep -E '^typedef' "$f"
	sed -n '/^\/\/ Round to nearest even/,/^}/p' "$f"
	grep -E '^#define (GG_BM|GG_BN|MM_THREADS) ' "$f"
	sed -n "${mma},$((mma + 8))p" "$f"
	sed -n "${first},\$p" "$f"
} >"$1"
