#!/usr/bin/env bash
# Nsight Compute profiles of the kernels that miss issue 6's targets, on the
# GPU machine: moe_align_block_size at T=16 and T=4096, and the grouped GEMM
# (tall gate_up and down kernels) at T=4096 in bf16 and fp8, at DeepSeek-V3
# shapes through `moeprep bench kernels`. Clocks are left alone
# (--clock-control none); --set basic gives speed of light, launch and
# occupancy sections. Reports go to $OUT as ncu-*.txt.
#
#   here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#   device: run(command="bash scripts/gpu-profile.sh", carry=[".gpu"])
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-profile}
mkdir -p "$out"
bin=$(pwd)/.gpu/moeprep
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine" >&2; exit 2; }
prof() { # name, kernel regex, count, bench args...
	local name=$1 re=$2 n=$3
	shift 3
	echo "== $name"
	"$ncu" --clock-control none --set basic -k "regex:$re" --launch-count "$n" \
		"$bin" bench kernels --no-progress --budget 0.05s "$@" >"$out/ncu-$name.txt" 2>&1
	echo "   rc=$?"
	grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Block Size|Grid Size|Theoretical Occupancy" "$out/ncu-$name.txt" | sed 's/^/   /'
}
prof align-t16 'moe_align' 1 --tokens 16 --dtype bf16
prof align-t4096 'moe_align' 3 --tokens 4096 --dtype bf16
prof gemm-t4096-bf16 'tall' 2 --tokens 4096 --dtype bf16
prof gemm-t4096-fp8 'tall' 2 --tokens 4096 --dtype fp8
