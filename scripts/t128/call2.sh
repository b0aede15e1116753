#!/usr/bin/env bash
# Device call 2 of the T = 128 study (GEMM_NOTES.md, issue 13 pass 7). From
# the repository root, with .t128dev holding: bins.tgz (moeprep_old from the
# parent commit, moeprep_new and kernels.test from the branch), tree/ (the
# branch's kernels/cuda, kernels/build, scripts/build-kernels.sh), m3only.cu
# (scripts/t128/mk_m3only.sh), harness.py and the shipped grouped_gemm.fatbin:
#   A. build-kernels.sh KERNELS_ONLY=grouped_gemm (4 targets) of the branch,
#      in the background;
#   B. sm_90a cubins of the mma3 kernels under -D variants, timed by the
#      harness beside the shipped kernels and the Triton peer;
#   C. moeprep bench (old embedded build), bench/torch_ref.py's Triton peer;
#   D. the kernels tests and moeprep bench on the fresh build.
set -uo pipefail
D=.t128dev
O=${OUT:-/tmp/t128out}
mkdir -p "$O" /tmp/v /tmp/bin
tar xzf "$D/bins.tgz" -C /tmp/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$O/device.txt"
rm -rf /tmp/kb && cp -r "$D/tree/kernels/build" /tmp/kb
(
	cd "$D/tree" || exit 1
	s=$SECONDS
	KERNEL_LOG_DIR=/tmp/kbl KERNELS_ONLY=grouped_gemm timeout 280 bash scripts/build-kernels.sh /tmp/kb >/tmp/kb.log 2>&1
	echo "build-kernels rc=$? in $((SECONDS - s)) s" >>/tmp/kb.log
) &
bpid=$!
build() {
	local name=$1
	shift
	timeout 150 nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --ptxas-options=-v "$@" \
		-o "/tmp/v/$name.cubin" "$D/m3only.cu" >"/tmp/v/$name.log" 2>&1 || echo "BUILD FAIL $name"
}
s=$SECONDS
pids=()
build n0 -DM3_BN_DOWN=64 & pids+=($!)
build n1 & pids+=($!)
build n2 -DM3_BN_DOWN=64 -DM3_STAGES_GATE_UP=5 -DM3_STAGES_DOWN=8 -DM3_EVICT_FIRST=1 & pids+=($!)
build n3 -DM3_BN_DOWN=64 -DM3_BK=128 -DM3_STAGES_GATE_UP=3 -DM3_STAGES_DOWN=3 -DM3_EVICT_FIRST=1 & pids+=($!)
build n4 -DM3_BN_DOWN=64 -DM3_STAGES_GATE_UP=5 -DM3_STAGES_DOWN=8 & pids+=($!)
build n5 -DM3_BN_DOWN=64 -DM3_BK=128 -DM3_STAGES_GATE_UP=3 -DM3_STAGES_DOWN=3 & pids+=($!)
build n6 -DM3_STAGES_GATE_UP=5 -DM3_EVICT_FIRST=1 & pids+=($!)
build n7 -DM3_BK=128 -DM3_STAGES_GATE_UP=3 -DM3_STAGES_DOWN=3 -DM3_EVICT_FIRST=1 & pids+=($!)
build n8 -DM3_BN_DOWN=64 -DM3_EVICT_FIRST=1 & pids+=($!)
build n9 -DM3_STAGES_GATE_UP=5 & pids+=($!)
build n10 -DM3_STAGES_GATE_UP=5 -DM3_STAGES_DOWN=5 -DM3_EVICT_FIRST=1 & pids+=($!)
build n11 -DM3_EVICT_FIRST=1 & pids+=($!)
wait "${pids[@]}"
echo "variants built in $((SECONDS - s)) s"
for f in /tmp/v/*.log; do
	echo "== $(basename "$f" .log)"
	grep -E "error|registers|spill|Compiling entry" "$f" | sed 's/^ptxas info *: //'
done >"$O/ptxas.txt" 2>&1
grep -E "error" "$O/ptxas.txt" | head
V=/tmp/v
specs=(n0=$V/n0.cubin:4:4:64:64:64:1 n1=$V/n1.cubin:4:4:64:64:128:1 n2=$V/n2.cubin:5:8:64:64:64:1
	n3=$V/n3.cubin:3:3:128:64:64:1 n4=$V/n4.cubin:5:8:64:64:64:1 n5=$V/n5.cubin:3:3:128:64:64:1
	n6=$V/n6.cubin:5:4:64:64:128:1 n7=$V/n7.cubin:3:3:128:64:128:1 n8=$V/n8.cubin:4:4:64:64:64:1
	n9=$V/n9.cubin:5:4:64:64:128:1 n10=$V/n10.cubin:5:5:64:64:128:1 n11=$V/n11.cubin:4:4:64:64:128:1)
ok=()
for sp in "${specs[@]}"; do
	f=${sp#*=}
	f=${f%%:*}
	[ -s "$f" ] && ok+=("$sp")
done
s=$SECONDS
PYTHONUNBUFFERED=1 T128_ROUNDS=${T128_ROUNDS:-40} timeout 200 python3 "$D/harness.py" "$O" "$D/grouped_gemm.fatbin" "${ok[@]}" 2>&1 | tee "$O/harness.log" | grep -v "^$"
echo "harness rc=${PIPESTATUS[0]} in $((SECONDS - s)) s"

bench() { # name, binary, [kernels dir]
	local s=$SECONDS
	if [ -n "${3:-}" ]; then
		MOEPREP_KERNELS_DIR=$3 timeout 120 "$2" bench kernels --dtype bf16 --tokens 128 --budget 0.5s --json >"$O/bench_$1.json" 2>"$O/bench_$1.log"
	else
		timeout 120 "$2" bench kernels --dtype bf16 --tokens 128 --budget 0.5s --json >"$O/bench_$1.json" 2>"$O/bench_$1.log"
	fi
	echo "bench $1 rc=$? in $((SECONDS - s)) s"
	grep -E "touched|T=128 (gemm|grouped|layer)" "$O/bench_$1.log"
}
bench old1 /tmp/bin/moeprep_old
s=$SECONDS
PYTHONUNBUFFERED=1 timeout 200 python3 bench/torch_ref.py --tokens 128 --no-compile --loop-budget 0.05 \
	--json "$O/torch.json" >"$O/torch.log" 2>&1
echo "torch_ref rc=$? in $((SECONDS - s)) s"
grep -E "triton|layer|align" "$O/torch.log"

wait $bpid
cat /tmp/kb.log | grep -vE "^ptxas|^$" | tail -20
tar czf "$O/kb.tgz" -C /tmp kb
tar czf "$O/kbl.tgz" -C /tmp kbl 2>/dev/null
if [ -s /tmp/kb/grouped_gemm.fatbin ]; then
	bench new1 /tmp/bin/moeprep_new /tmp/kb
	bench old2 /tmp/bin/moeprep_old
	bench new2 /tmp/bin/moeprep_new /tmp/kb
	s=$SECONDS
	(cd "$D/tree/kernels" && MOEPREP_KERNELS_DIR=/tmp/kb timeout 240 /tmp/bin/kernels.test -test.v >"$O/kernels_test.log" 2>&1)
	echo "kernels.test rc=$? in $((SECONDS - s)) s"
	grep -cE "^\s*--- PASS" "$O/kernels_test.log"
	grep -E "^\s*--- (FAIL|SKIP)" "$O/kernels_test.log" | head -20
	grep -E "MMA3Exact" "$O/kernels_test.log" | head -12
fi
