#!/usr/bin/env bash
# The GPU test pipeline, in two halves (the GPU machine has nvcc but no Go).
#
# 1. Here, on the development machine:
#        scripts/gpu-test.sh build
#    cross-builds (CGO_ENABLED=0, linux/amd64) one test binary per GPU package
#    into .gpu/ (git-ignored: the script adds /.gpu/ to .git/info/exclude).
#
# 2. On the GPU machine, through the device tool:
#        run(command="bash scripts/gpu-test.sh run", carry=[".gpu"], timeout_s=600)
#    builds the kernels with scripts/build-kernels.sh into kernels/build, runs
#    every test binary -test.v against those fresh fatbins ($MOEPREP_KERNELS_DIR)
#    and prints a summary. $OUT receives kernels-build.tgz (fatbins + BUILD.json),
#    build-logs.tgz (nvcc/ptxas reports), one log per binary and summary.txt.
#    GPU_TEST_RUN=regex limits the tests (-test.run); GPU_TEST_PKGS="validate"
#    limits the packages; GPU_TEST_KERNELS=embedded skips the nvcc build and
#    tests the fatbins embedded in the binaries (valid only while
#    kernels/build matches kernels/cuda: the kernels build test checks that).
#    validate's tests (validate --device cuda on every HF fixture conversion
#    and the mutation suite on the GPU) run from validate/, next to
#    fixtures/hf; validate/rankproof's (per-rank outputs recomposed on the
#    GPU, every fixture and combination) from validate/rankproof/.
#
# 3. Back here, embed the build the tests just passed with:
#        tar xzf <files_at>/kernels-build.tgz -C kernels/
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
pkgs=(internal/cuda kernels validate validate/rankproof)
[ -n "${GPU_TEST_PKGS:-}" ] && read -r -a pkgs <<<"$GPU_TEST_PKGS"

# GPU_TEST_BIN_DIR: where the test binaries live (default .gpu), so that
# two people's builds need not share one folder.
bindir=${GPU_TEST_BIN_DIR:-.gpu}

case "${1:-}" in
build)
	grep -qx "/$bindir/" .git/info/exclude 2>/dev/null || echo "/$bindir/" >>.git/info/exclude
	mkdir -p "$bindir"
	for p in "${pkgs[@]}"; do
		bin=$bindir/$(echo "$p" | tr / _).test
		CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -o "$bin" "./$p" || exit 1
		echo "built $bin"
	done
	;;
run)
	out=${OUT:-/tmp/gpu-test-out}
	mkdir -p "$out"
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
	build_rc=0
	if [ "${GPU_TEST_KERNELS:-}" = embedded ]; then
		echo "== using the embedded kernels (no nvcc build)"
	else
		echo "== building kernels"
		KERNEL_LOG_DIR=/tmp/kernel-build-logs bash scripts/build-kernels.sh kernels/build
		build_rc=$?
		tar czf "$out/kernels-build.tgz" -C kernels build
		tar czf "$out/build-logs.tgz" -C /tmp kernel-build-logs
		export MOEPREP_KERNELS_DIR=$root/kernels/build
	fi
	runargs=()
	[ -n "${GPU_TEST_RUN:-}" ] && runargs=(-test.run "$GPU_TEST_RUN")
	summary=$out/summary.txt
	echo "kernel build: rc=$build_rc" >"$summary"
	rc=$build_rc
	for p in "${pkgs[@]}"; do
		name=$(echo "$p" | tr / _)
		bin=$root/$bindir/$name.test
		echo "== $p"
		(cd "$p" && "$bin" -test.v -test.timeout "${GPU_TEST_TIMEOUT:-240s}" "${runargs[@]}") >"$out/$name.log" 2>&1
		prc=$?
		[ $prc -ne 0 ] && rc=1
		pass=$(grep -c -- '--- PASS' "$out/$name.log")
		fail=$(grep -c -- '--- FAIL' "$out/$name.log")
		skip=$(grep -c -- '--- SKIP' "$out/$name.log")
		{
			echo "$p: rc=$prc pass=$pass fail=$fail skip=$skip"
			grep -E -- '--- (FAIL|SKIP)' "$out/$name.log" | sed 's/^/  /'
			grep -E '^\s+\S+_test.go:[0-9]+: (device|gate |align |axpy|grouped|router|finalize|unfused|bench|timing|caught|bf16 block|f32 block)' "$out/$name.log" | sed 's/^ */  /'
		} >>"$summary"
		grep -E -- '--- FAIL|panic|^\s+\S+_test.go' "$out/$name.log" | head -60
	done
	echo "== summary"
	cat "$summary"
	exit $rc
	;;
*)
	echo "usage: scripts/gpu-test.sh build|run" >&2
	exit 2
	;;
esac
