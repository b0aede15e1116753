#!/usr/bin/env bash
# Issue 12's benchmark: moeprep convert and fuse-shared --tp 8 against `cp -r`
# of the same checkpoint, each run from a cold page cache (sync, then
# drop_caches; run as root), with `sync` inside cp's timing because moeprep
# fsyncs what it writes. The order of (cp, convert, fuse-shared) rotates from
# round to round; the table gives the median of the rounds, its ratio to cp's
# median (x_cp), the median of the per-round ratios to that round's cp
# (paired: the disk's speed drifts over minutes on this VM, and a round's
# three runs share its mood), peak RSS, the median number of write requests
# the disk completed during the run (wr_reqs; cp's are 4 MiB each here), and
# every raw figure.
#
# Before every timed run the script syncs, waits SETTLE seconds (default 5)
# and syncs again, then drops the page cache. This VM's disk is a write-back
# cache on the host, and the file system is mounted with `discard`: a run's
# sync returns before the host has written back the previous run's output
# and trimmed its deleted blocks, and a run started at once pays for part of
# that (BENCHMARKS.md, issue 12, sixth pass). The wait is the same for every
# run.
#
# MOEPREP_BASE=path/to/an/earlier/moeprep adds its convert and fuse-shared to
# the rotation (convert@base, fuse@base), to compare two builds side by side.
#
# Shapes (those of issue 12):
#   A  bf16 DeepSeek-V3-shaped, 64 experts, I 288: 1.6 GB, one source and one output shard
#   B  bf16 DeepSeek-V3-shaped, 256 experts, I 512: 6.5 GB, 4 source shards, 3 output shards
#   Q  bf16 Qwen3-MoE-shaped (synthetic), 6 layers of 128 experts, H 2048, I 768: 7.3 GB,
#      2 source shards (issue 12's third row was a 7.6 GB Qwen3-MoE on the GPU machine)
#   D  FP8 (128x128 blocks) DeepSeek-V3-shaped, 176 experts, I 288: 1.5 GB, one source and one
#      output shard; its runs are cp, convert and convert --dtype bf16 (issue 29: the output is
#      twice the source, every FP8 weight dequantised)
# Quantised shapes (issue 29), H 7168, 2 MoE layers of 64 experts top-8 + 1 shared, unless said:
#   F  DeepSeek-V3 FP8 128x128 blocks, I 576: 2.2 GB
#   K  Kimi-K2-Thinking INT4 (compressed-tensors pack-quantized, group 32) routed experts, BF16 shared, I 1152
#   N  DeepSeek-R1 ModelOpt NVFP4 routed and shared experts, I 1152
#   M  gpt-oss-shaped (H 2880, 128 experts) MXFP4 experts stacked on disk, 1 layer
#   T  bf16 DeepSeek-V3-shaped, 2 MoE layers of 64 experts, H 2048, I 1024: 1.6 GB, one source and
#      one output shard; runs cp, convert and convert --orientation in-out (issue 30: every
#      expert transposed, the in-out row `inout`)
#   E  FP8 (128x128) DeepSeek-V3 dims (preset deepseek-v3-shaped: H 7168, I 2048, 3 layers, the
#      first dense) with 64 experts: 6.16 GB; runs cp, convert --ep 8 and fuse-shared --tp 8
#      --ep 8 (issue 43: per-rank outputs, rows `conv-ep8`, `fuse-ep8`)
#
#   scripts/bench-convert.sh [WORK] [ROUNDS] [SHAPES]
#   sudo scripts/bench-convert.sh /work/bench 3 "A B"     # needs ~3x the checkpoint free
#   MOEPREP_BIN=.gpu/moeprep bash scripts/bench-convert.sh /tmp/bench 3 Q   # where there is no Go
#   MOEPREP_BASE=/work/bench/mp-old SETTLE=5 scripts/bench-convert.sh /work/bench 5 A
set -euo pipefail
work=${1:-/work/bench}
rounds=${2:-3}
shapes=${3:-A B}
cd "$(dirname "$0")/.."
mkdir -p "$work"
settle=${SETTLE:-5}
base=${MOEPREP_BASE:-}
mp=${MOEPREP_BIN:-}
if [ -z "$mp" ]; then
	go build -o "$work/moeprep" ./cmd/moeprep
	mp="$work/moeprep"
fi
[ -w /proc/sys/vm/drop_caches ] || echo "warning: not root, page cache not dropped: figures are warm" >&2

# The block device under WORK, whose write requests the table counts: how
# big they are says how the page cache was filled (BENCHMARKS.md, issue 12,
# sixth pass). Partitions count in their own stat file.
dev=$(basename "$(df --output=source "$work" | tail -1)")
devstat=$(ls /sys/class/block/"$dev"/stat 2>/dev/null || echo /dev/null)
# writes: completed write requests so far (field 5 of the stat file)
writes() { awk '{print $5 + 0}' "$devstat"; }

# measure CMD...: prints "wall user sys peak_rss_MB write_requests" of CMD,
# from a cold cache
measure() {
	sync
	sleep "$settle"
	sync
	if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; fi
	local w0
	w0=$(writes)
	/usr/bin/time -f "%e %U %S %M" -o "$work/time.txt" "$@" >/dev/null
	awk -v w=$(($(writes) - w0)) '{printf "%s %s %s %.0f %d\n", $1, $2, $3, $4/1024, w}' "$work/time.txt"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

printf '%-5s %-12s %8s %7s %7s %7s %7s %8s %7s   %s\n' shape run median_s x_cp paired GB/s rss_MB out_GB wr_reqs "raw (wall/user/sys s per round)"
for shape in $shapes; do
	src=$(readlink -f "$work/src-$shape" || echo "$work/src-$shape")
	dtype=bf16
	case $shape in
	A) synth=(--experts 64 --intermediate 288) ; maxshard=5GB ;;
	D) synth=(--experts 176 --intermediate 288) ; maxshard=5GB ; dtype=fp8 ;;
	B) synth=(--experts 256 --intermediate 512 --max-shard-size 1.7GB) ; maxshard=3GB ;;
	Q) synth=(--family qwen3_moe --experts 128 --hidden 2048 --intermediate 768 --num-layers 6 --max-shard-size 4GB) ; maxshard=5GB ;;
	F) synth=(--preset deepseek-v3-shaped --dtype fp8 --intermediate 576) ; maxshard=5GB ;;
	K) synth=(--preset small-kimi-k2-int4 --hidden 7168 --intermediate 1152) ; maxshard=5GB ;;
	N) synth=(--preset small-deepseek-r1-nvfp4 --hidden 7168 --intermediate 1152) ; maxshard=5GB ;;
	M) synth=(--preset gpt-oss-shaped --dtype mxfp4 --num-layers 1) ; maxshard=5GB ;;
	T) synth=(--family deepseek_v3 --experts 64 --hidden 2048 --intermediate 1024 --num-layers 2 --dense-layers 0) ; maxshard=5GB ;;
	E) synth=(--preset deepseek-v3-shaped --dtype fp8 --experts 64) ; maxshard=5GB ;;
	*) echo "unknown shape $shape" >&2; exit 2 ;;
	esac
	if [ ! -d "$src" ]; then
		if [ "$shape" = Q ] || [ "$shape" = T ]; then
			"$mp" fixture synth --dtype bf16 "${synth[@]}" --no-progress "$src" >&2
		elif [ "$shape" = M ] || [ "$shape" = E ]; then
			"$mp" fixture synth "${synth[@]}" --no-progress "$src" >&2
		elif [ "$shape" != A ] && [ "$shape" != B ]; then
			"$mp" fixture synth "${synth[@]}" --num-layers 2 --dense-layers 0 --experts 64 --top-k 8 --no-progress "$src" >&2
		else
			"$mp" fixture synth --preset deepseek-v3-shaped --dtype "$dtype" --num-layers 2 "${synth[@]}" --no-progress "$src" >&2
		fi
	fi
	# Warm-up, untimed and discarded: this machine is a Firecracker VM whose
	# kernel reports freed memory to the host (page_reporting), and the host
	# takes those pages back. After a pause, the first run re-faults every
	# page it touches from the host: 12.9 s with 21 s of system time for a
	# convert of B that takes 6.3 s right after, 8.0 s against 6.5 s for cp
	# (BENCHMARKS.md, issue 12, fourth pass). The page cache is still dropped
	# before every timed run.
	measure sh -c 'cp -r "$1" "$2" && sync' sh "$src" "$work/out-$shape" >/dev/null
	rm -rf "$work/out-$shape"
	runs=(cp convert fuse)
	# Qwen3-MoE and gpt-oss have no shared expert to fuse, and Kimi's INT4
	# routed experts beside a BF16 shared one cannot be fused without
	# requantising: two convert runs per round
	case $shape in Q | K | M) runs=(cp convert convert) ;; esac
	[ "$shape" = D ] && runs=(cp convert dtype)
	[ "$shape" = T ] && runs=(cp convert inout)
	[ "$shape" = E ] && runs=(cp conv-ep8 fuse-ep8)
	if [ -n "$base" ]; then
		runs+=(convert@base)
		case $shape in Q | K | M) ;; *) runs+=(fuse@base) ;; esac
	fi
	declare -A secs=() raw=() rss=() bytes=() ratios=() reqs=()
	for r in $(seq "$rounds"); do
		declare -A round=()
		for i in $(seq 0 $((${#runs[@]} - 1))); do
			run=${runs[$(( (i + r) % ${#runs[@]} ))]}
			out="$work/out-$shape"
			rm -rf "$out" "$out.partial"
			case $run in
			cp) read -r s u y m q < <(measure sh -c 'cp -r "$1" "$2" && sync' sh "$src" "$out") ;;
			convert) read -r s u y m q < <(measure "$mp" convert --max-shard-size "$maxshard" --no-progress "$src" "$out") ;;
			fuse) read -r s u y m q < <(measure "$mp" fuse-shared --tp 8 --max-shard-size "$maxshard" --no-progress "$src" "$out") ;;
			dtype) read -r s u y m q < <(measure "$mp" convert --dtype bf16 --max-shard-size "$maxshard" --no-progress "$src" "$out") ;;
			conv-ep8) read -r s u y m q < <(measure "$mp" convert --ep 8 --max-shard-size "$maxshard" --no-progress "$src" "$out") ;;
			fuse-ep8) read -r s u y m q < <(measure "$mp" fuse-shared --tp 8 --ep 8 --max-shard-size "$maxshard" --no-progress "$src" "$out") ;;
			inout) read -r s u y m q < <(measure "$mp" convert --orientation in-out --max-shard-size "$maxshard" --no-progress "$src" "$out") ;;
			convert@base) read -r s u y m q < <(measure "$base" convert --max-shard-size "$maxshard" --no-progress "$src" "$out") ;;
			fuse@base) read -r s u y m q < <(measure "$base" fuse-shared --tp 8 --max-shard-size "$maxshard" --no-progress "$src" "$out") ;;
			esac
			secs[$run]+="$s "
			round[$run]+="$s "
			raw[$run]+="$s/$u/$y "
			rss[$run]=$(( ${rss[$run]:-0} > m ? ${rss[$run]:-0} : m ))
			reqs[$run]+="$q "
			bytes[$run]=$(du -sb "$out" | cut -f1)
			rm -rf "$out"
		done
		for run in "${!round[@]}"; do
			for x in ${round[$run]}; do
				ratios[$run]+="$(awk -v a="$x" -v b="${round[cp]}" 'BEGIN { printf "%.4f", a/b }') "
			done
		done
		unset round
	done
	cp_med=$(tr ' ' '\n' <<<"${secs[cp]}" | grep . | median)
	for run in $(printf '%s\n' "${runs[@]}" | awk '!seen[$0]++'); do
		med=$(tr ' ' '\n' <<<"${secs[$run]}" | grep . | median)
		pr=$(tr ' ' '\n' <<<"${ratios[$run]}" | grep . | median)
		rq=$(tr ' ' '\n' <<<"${reqs[$run]}" | grep . | median)
		awk -v sh="$shape" -v n="$run" -v s="$med" -v c="$cp_med" -v p="$pr" -v m="${rss[$run]}" -v b="${bytes[$run]}" -v q="$rq" -v raw="${raw[$run]}" \
			'BEGIN { printf "%-5s %-12s %8.2f %7.2f %7.2f %7.2f %7s %8.2f %7d   %s\n", sh, n, s, s/c, p, b/s/1e9, m, b/1e9, q, raw }'
	done
	unset secs raw rss bytes ratios reqs
done
