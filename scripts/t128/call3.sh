#!/usr/bin/env bash
# Device call 3 of the T = 128 study (GEMM_NOTES.md, issue 13 pass 7): the
# adopted mma3 (column tiles fastest, 5 / 8 stages) built by
# scripts/build-kernels.sh (4 targets), the kernels tests on that build,
# moeprep bench old / new alternately beside bench/torch_ref.py's Triton peer,
# and the harness (both routings) on sm_90a cubins of the adopted source and
# of a few untried depths. .t128dev as for call2.sh (bins.tgz: moeprep_old,
# moeprep_new, kernels.test; tree/; m3only.cu; harness.py; the shipped
# grouped_gemm.fatbin). $OUT: kb.tgz (the fresh kernels/build), r.tgz (logs,
# JSON), summary.txt.
set -uo pipefail
D=.t128dev
O=${OUT:-/tmp/t128out}
R=/tmp/r
mkdir -p "$O" "$R" /tmp/v /tmp/bin
tar xzf "$D/bins.tgz" -C /tmp/bin
{
	nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv
	nvcc --version | tail -2
} | tee "$R/device.txt"
rm -rf /tmp/kb && cp -r "$D/tree/kernels/build" /tmp/kb
(
	cd "$D/tree" || exit 1
	s=$SECONDS
	KERNEL_LOG_DIR=/tmp/kbl KERNELS_ONLY=grouped_gemm timeout 200 bash scripts/build-kernels.sh /tmp/kb >/tmp/kb.log 2>&1
	echo "build-kernels rc=$? in $((SECONDS - s)) s" >>/tmp/kb.log
) &
bpid=$!
build() {
	local name=$1
	shift
	timeout 150 nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --ptxas-options=-v "$@" \
		-o "/tmp/v/$name.cubin" "$D/m3only.cu" >"/tmp/v/$name.log" 2>&1 || echo "BUILD FAIL $name"
}
pids=()
build adopted & pids+=($!)
build c4x4 -DM3_STAGES_GATE_UP=4 -DM3_STAGES_DOWN=4 & pids+=($!)
build c4x4n128 -DM3_STAGES_GATE_UP=4 -DM3_STAGES_DOWN=4 -DM3_BN_DOWN=128 & pids+=($!)
build g6 -DM3_STAGES_GATE_UP=6 & pids+=($!)
build d10 -DM3_STAGES_DOWN=10 & pids+=($!)
build g3d6 -DM3_STAGES_GATE_UP=3 -DM3_STAGES_DOWN=6 & pids+=($!)
wait "${pids[@]}"
for f in /tmp/v/*.log; do
	echo "== $(basename "$f" .log)"
	grep -E "error|registers|spill|Compiling entry" "$f" | sed 's/^ptxas info *: //'
done >"$R/ptxas_variants.txt" 2>&1
V=/tmp/v
s=$SECONDS
PYTHONUNBUFFERED=1 T128_ROUNDS=${T128_ROUNDS:-30} timeout 200 python3 "$D/harness.py" "$R" "$D/grouped_gemm.fatbin" \
	adopted=$V/adopted.cubin:5:8:64:64:64:1 c4x4=$V/c4x4.cubin:4:4:64:64:64:1 c4x4n128=$V/c4x4n128.cubin:4:4:64:64:128:1 \
	g6=$V/g6.cubin:6:8:64:64:64:1 d10=$V/d10.cubin:5:10:64:64:64:1 g3d6=$V/g3d6.cubin:3:6:64:64:64:1 \
	2>&1 | tee "$R/harness.log" | grep -v "^$"
echo "harness rc=${PIPESTATUS[0]} in $((SECONDS - s)) s"

bench() { # name, binary, [kernels dir]
	local s=$SECONDS
	MOEPREP_KERNELS_DIR=${3:-} timeout 120 "$2" bench kernels --dtype bf16 --tokens 128 --budget 0.4s --json \
		>"$R/bench_$1.json" 2>"$R/bench_$1.log"
	echo "bench $1 rc=$? in $((SECONDS - s)) s"
	grep -E "touched|T=128 " "$R/bench_$1.log"
}
bench old1 /tmp/bin/moeprep_old
s=$SECONDS
PYTHONUNBUFFERED=1 timeout 200 python3 bench/torch_ref.py --tokens 128 --no-compile --budget 0.4 --loop-budget 0.05 \
	--json "$R/torch.json" >"$R/torch.log" 2>&1
echo "torch_ref rc=$? in $((SECONDS - s)) s"
grep -E "T=" "$R/torch.log"
wait $bpid
grep -vE "^ptxas|^$|^ +[0-9]+ bytes stack" /tmp/kb.log | tail -12
tar czf "$O/kb.tgz" -C /tmp kb
if [ -s /tmp/kb/grouped_gemm.fatbin ]; then
	bench new1 /tmp/bin/moeprep_new /tmp/kb
	bench old2 /tmp/bin/moeprep_old
	bench new2 /tmp/bin/moeprep_new /tmp/kb
	s=$SECONDS
	(cd "$D/tree/kernels" && MOEPREP_KERNELS_DIR=/tmp/kb timeout 200 /tmp/bin/kernels.test -test.v >"$R/kernels_test.log" 2>&1)
	echo "kernels.test rc=$? in $((SECONDS - s)) s"
	echo "PASS lines (tests + subtests): $(grep -cE '^\s*--- PASS' "$R/kernels_test.log"), top-level: $(grep -cE '^--- PASS' "$R/kernels_test.log")"
	grep -E "^\s*--- (FAIL|SKIP)|^(ok|FAIL|PASS)" "$R/kernels_test.log" | head -20
	grep -E "TestGroupedGEMMMMA3Exact|TestBuildMatchesSources" "$R/kernels_test.log" | grep -- "---" | head -12
fi
cp /tmp/kb.log "$R/kb.log"
tar czf "$R/kbl.tgz" -C /tmp kbl 2>/dev/null
tar czf "$O/r.tgz" -C /tmp r
