#!/usr/bin/env bash
# Structure check of the CUDA sources without nvcc (a quick check before
# spending device time): g++ parses every kernels/cuda/*.cu (with the shared
# headers kernels/cuda/*.cuh they include) and the standalone harnesses
# scripts/wg/harness*.cu with stand-in CUDA declarations
# (scripts/wg/standin/), inline asm swallowed and <<<...>>> launches turned
# into calls, three times: as the host pass, as an sm_90a device pass
# (__CUDA_ARCH__ 900 with the arch-specific feature macro) and as an sm_80
# device pass, so every #if branch the fatbin builds is read, templates
# instantiate and static_asserts (shared memory, registers, tile shapes,
# scale-block span) are evaluated. It checks C++ only: no PTX, no nvcc
# rules (the device passes are g++, so device-only restrictions such as
# calling a host function are not caught).
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kernels/cuda" "$tmp/scripts/wg"
srcs=(kernels/cuda/*.cu)
harnesses=(scripts/wg/harness*.cu)
for f in "${srcs[@]}" kernels/cuda/*.cuh "${harnesses[@]}" scripts/wg/*.cuh; do
	[ -e "$f" ] || continue
	perl -0pe 's/\basm\s+volatile\s*\(/ASMV(/g; s/\basm\s*\(/ASMV(/g; s/<<<.*?>>>//gs' "$f" >"$tmp/$f"
done
inc="-include scripts/wg/standin/cuda_standin.h -Iscripts/wg/standin"
# Swallowed asm leaves its operands unused: those warnings say nothing.
warn="-Wall -Wno-unknown-pragmas -Wno-unused-variable -Wno-unused-but-set-variable"
for pass in "" "-D__CUDA_ARCH__=900 -D__CUDA_ARCH_FEAT_SM90_ALL" "-D__CUDA_ARCH__=800"; do
	echo "== g++ -fsyntax-only ${pass:-(host pass)}"
	for f in "${srcs[@]}"; do
		# shellcheck disable=SC2086
		g++ -std=c++17 -fsyntax-only $warn $inc $pass -x c++ "$tmp/$f"
		echo "   $f"
	done
	for f in "${harnesses[@]}"; do
		# shellcheck disable=SC2086
		g++ -std=c++17 -fsyntax-only $warn $inc $pass -x c++ "$tmp/$f"
		echo "   $f"
	done
done
echo "syntax-check: ok"
