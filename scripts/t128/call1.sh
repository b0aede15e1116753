#!/usr/bin/env bash
# Device call 1 of the T = 128 study (GEMM_NOTES.md, issue 13 pass 7): build
# the mma3 variants of m3var.cu (sm_90a cubins), time them beside the shipped
# kernels and the Triton peer in one process (harness.py), then moeprep's own
# bench at T = 128 on the shipped build. Run from the repository root with
# this folder and a stripped moeprep binary copied to .t128dev:
#   run(command="bash .t128dev/call1.sh", carry=[".t128dev"], timeout_s=300)
set -uo pipefail
D=.t128dev
O=${OUT:-/tmp/t128out}
mkdir -p "$O" /tmp/v
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$O/device.txt"
build() {
	local name=$1
	shift
	timeout 150 nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --ptxas-options=-v "$@" \
		-o "/tmp/v/$name.cubin" "$D/m3var.cu" >"/tmp/v/$name.log" 2>&1 || echo "BUILD FAIL $name"
}
s=$SECONDS
build v0 &
build va -DV_GU_STAGES=5 -DV_DN_STAGES=8 &
build vb -DV_BK=128 -DV_GU_STAGES=3 -DV_DN_STAGES=3 &
build vb4 -DV_BK=128 -DV_GU_STAGES=3 -DV_DN_STAGES=4 &
build vc -DV_EVICT=1 &
build vd -DV_DN_BN=128 &
build ve -DV_GU_BN=32 &
build ve5 -DV_GU_BN=32 -DV_GU_STAGES=5 &
build vf -DV_COLS_FAST=1 &
build vp -DV_PDL=1 &
build vac -DV_GU_STAGES=5 -DV_DN_STAGES=8 -DV_EVICT=1 &
build vbc -DV_BK=128 -DV_GU_STAGES=3 -DV_DN_STAGES=3 -DV_EVICT=1 &
build vx1 -DV_GU_BN=32 -DV_GU_STAGES=5 -DV_DN_BN=128 -DV_DN_STAGES=4 &
build vx2 -DV_GU_BN=32 -DV_GU_STAGES=5 -DV_DN_BN=128 -DV_DN_STAGES=4 -DV_EVICT=1 &
wait
echo "variants built in $((SECONDS - s)) s"
for f in /tmp/v/*.log; do
	echo "== $(basename "$f" .log)"
	grep -E "error|registers|spill|Compiling entry" "$f" | sed 's/^ptxas info *: //'
done >"$O/ptxas.txt" 2>&1
grep -E "error" "$O/ptxas.txt" | head
V=/tmp/v
specs=(v0=$V/v0.cubin va=$V/va.cubin:5:8 vb=$V/vb.cubin:3:3:128 vb4=$V/vb4.cubin:3:4:128 vc=$V/vc.cubin
	vd=$V/vd.cubin:4:4:64:64:128 ve=$V/ve.cubin:4:4:64:32 ve5=$V/ve5.cubin:5:4:64:32 vf=$V/vf.cubin:4:4:64:64:64:1
	vp=$V/vp.cubin:4:4:64:64:64:0:1 vac=$V/vac.cubin:5:8 vbc=$V/vbc.cubin:3:3:128
	vx1=$V/vx1.cubin:5:4:64:32:128 vx2=$V/vx2.cubin:5:4:64:32:128)
ok=()
for sp in "${specs[@]}"; do
	f=${sp#*=}
	f=${f%%:*}
	[ -s "$f" ] && ok+=("$sp")
done
s=$SECONDS
PYTHONUNBUFFERED=1 T128_ROUNDS=${T128_ROUNDS:-40} timeout 220 python3 "$D/harness.py" "$O" "$D/grouped_gemm.fatbin" "${ok[@]}" 2>&1 | tee "$O/harness.log" | grep -v "^$"
echo "harness rc=${PIPESTATUS[0]} in $((SECONDS - s)) s"
s=$SECONDS
timeout 150 "$D/moeprep" bench kernels --dtype bf16 --tokens 128 --budget 0.3s --gemm-path mma3 --json >"$O/bench_base.json" 2>"$O/bench_base.log"
echo "bench rc=$? in $((SECONDS - s)) s"
grep -E "touched|T=128" "$O/bench_base.log"
