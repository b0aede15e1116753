#!/usr/bin/env bash
# Nsight Compute profiles behind issue 13's cells that still miss (bf16 at
# T = 16, 128 and 4096): moeprep's grouped GEMM kernels as `bench kernels`
# runs them (the path auto picks), and the Triton fused-MoE peer's kernel
# (bench/triton_moe.py) at T = 128 with the config that won gpu-bench.sh's
# sweep there (BLOCK_M 16, BLOCK_N 64, BLOCK_K 128, 4 warps, 4 stages), on a
# DeepSeek-V3-shaped bank (264 experts, H 7168, I 2048, top-8 + the shared
# slot). Clocks are left alone; ncu flushes caches before each kernel.
#   here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#   device: run(command="bash scripts/gpu-profile-peers.sh", carry=[".gpu"], timeout_s=480)
# $OUT receives ncu-*.txt and summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${OUT:-/tmp/gpu-profile-peers}
mkdir -p "$out"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine" >&2; exit 2; }
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy)
keep='^  [A-Za-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Block Size|Grid Size|Dynamic Shared|Stall|Warp Cycles Per Issued'
summ() { grep -E "$keep" "$1" | sed 's/^/   /' | tee -a "$out/summary.txt"; }
mp() { # name, tokens, kernel regex, count
	echo "== moeprep $1" | tee -a "$out/summary.txt"
	timeout 150 "$ncu" --clock-control none "${sections[@]}" -k "regex:$3" --launch-count "$4" \
		"$root/.gpu/moeprep" bench kernels --no-progress --budget 0.05s --dtype bf16 --tokens "$2" >"$out/ncu-$1.txt" 2>&1
	echo "   rc=$?" | tee -a "$out/summary.txt"
	summ "$out/ncu-$1.txt"
}
mp bf16-t16 16 'moe_(gate_up|down)' 2
mp bf16-t128 128 'moe_(gate_up|down)' 2
mp bf16-t4096 4096 'moe_(gate_up|down)' 2

echo "== triton peer bf16-t128" | tee -a "$out/summary.txt"
cat >/tmp/triton_profile.py <<'PY'
import sys, torch
sys.path.insert(0, "bench")
import torch_ref as tr, triton_moe as tm
t = int(sys.argv[1])
torch.manual_seed(0)
g = tr.E + tr.REPLICAS
x = (torch.randn(t, tr.H, device="cuda") * 0.5).to(torch.bfloat16)
gu = (torch.randn(g, 2 * tr.I, tr.H, device="cuda", dtype=torch.bfloat16) * 0.02)
dn = (torch.randn(g, tr.H, tr.I, device="cuda", dtype=torch.bfloat16) * 0.02)
routed = torch.stack([torch.randperm(tr.E, device="cuda")[: tr.TOPK] for _ in range(t)])
shared = tr.E + (torch.arange(t, device="cuda") % tr.REPLICAS)
ids = torch.cat([routed, shared[:, None]], dim=1)
w = torch.rand(t, tr.TOPK + 1, device="cuda")
cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
align = lambda i: tr.align_block_size(i, g, cfg["BLOCK_M"], graphable=True)
for _ in range(3):
    tm.experts_triton(x, ids, w, gu, dn, align, cfg)
torch.cuda.synchronize()
print("ok")
PY
timeout 200 "$ncu" --clock-control none "${sections[@]}" -k "regex:moe_gemm_kernel" --launch-skip 2 --launch-count 2 \
	python3 /tmp/triton_profile.py 128 >"$out/ncu-triton-bf16-t128.txt" 2>&1
echo "   rc=$?" | tee -a "$out/summary.txt"
summ "$out/ncu-triton-bf16-t128.txt"
