#!/usr/bin/env bash
# Structure check of the Hopper sources without nvcc (written before any GPU run; still a quick check before spending device time):
# g++ parses act_quant.cu, grouped_gemm_wg_fp8.cu, grouped_gemm_wg.cu (with
# wg_common.cuh, which both include) and harness_fp8.cu with
# stand-in CUDA declarations (scripts/wg/standin/), inline asm swallowed and
# <<<...>>> launches turned into calls, once as the host pass and once as an
# sm_90a device pass (__CUDA_ARCH__ 900 with the arch-specific feature macro),
# so templates instantiate and static_asserts (shared memory, registers,
# scale-block span) are evaluated. It checks C++ only: no PTX, no nvcc rules.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kernels/cuda" "$tmp/scripts/wg"
for f in kernels/cuda/act_quant.cu kernels/cuda/grouped_gemm_wg_fp8.cu kernels/cuda/grouped_gemm_wg.cu kernels/cuda/wg_common.cuh \
	scripts/wg/harness_fp8.cu; do
	perl -0pe 's/\basm\s+volatile\s*\(/ASMV(/g; s/\basm\s*\(/ASMV(/g; s/<<<.*?>>>//gs' "$f" >"$tmp/$f"
done
inc="-include scripts/wg/standin/cuda_standin.h -Iscripts/wg/standin"
for pass in "" "-D__CUDA_ARCH__=900 -D__CUDA_ARCH_FEAT_SM90_ALL" "-D__CUDA_ARCH__=800"; do
	echo "== g++ -fsyntax-only ${pass:-host pass}"
	# shellcheck disable=SC2086
	g++ -std=c++17 -fsyntax-only -Wall -Wno-unknown-pragmas -Wno-unused-variable -Wno-unused-but-set-variable $inc $pass -x c++ "$tmp/scripts/wg/harness_fp8.cu"
	# shellcheck disable=SC2086
	g++ -std=c++17 -fsyntax-only -Wall -Wno-unknown-pragmas $inc $pass -x c++ "$tmp/kernels/cuda/grouped_gemm_wg_fp8.cu"
	# shellcheck disable=SC2086
	g++ -std=c++17 -fsyntax-only -Wall -Wno-unknown-pragmas $inc $pass -x c++ "$tmp/kernels/cuda/act_quant.cu"
	# shellcheck disable=SC2086
	g++ -std=c++17 -fsyntax-only -Wall -Wno-unknown-pragmas $inc $pass -x c++ "$tmp/kernels/cuda/grouped_gemm_wg.cu"
done
echo "syntax-check: ok"
