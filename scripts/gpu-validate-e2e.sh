#!/usr/bin/env bash
# validate end to end at I/O speed (issue 6): a synthetic DeepSeek-V3-shaped
# FP8 model (256 experts, H 7168, I 2048, top-8, groups 8/4; 1 dense + 3 MoE
# layers, ~35 GB; 2 MoE layers when space is short), fuse-shared --tp 8, the
# files read once to warm the page cache, then
#   validate --device cuda --cpu-check none --tokens 64 --io-baseline
# and one line per layer: the layer's validate time, the time to read the
# same bytes from the page cache and copy them to the GPU (same staging
# buffers, no compute), and their ratio (target <= 1.5).
#
#   here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#   device: run(command="bash scripts/gpu-validate-e2e.sh", carry=[".gpu"])
#
# SRC goes to /dev/shm, DST to disk (both removed at the end). Report (JSON
# and table) and progress log go to $OUT. Extra arguments go to validate.
# The fused path alone has no GPU-only mode without SRC (DST alone needs
# --golden), so only the SRC+DST run is timed.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/gpu-validate-lib.sh
need_bin
out=${OUT:-/tmp/gpu-validate-e2e}
mkdir -p "$out"
src=/dev/shm/moeprep-e2e-src
dst=$(pwd)/.e2e-dst
scratch "$src" "$dst"
gpu_setup
# One FP8 MoE layer is ~11.5 GB in SRC and ~11.8 GB after fuse-shared
# --tp 8; the dense layer and embeddings ~0.6 GB. Keep 8 GB spare on each.
avail_gb() { df -BG --output=avail "$1" | tail -1 | tr -dc 0-9; }
layers=4
if [ "$(avail_gb /dev/shm)" -lt 44 ] || [ "$(avail_gb .)" -lt 45 ]; then
	layers=3
	echo "== less than ~45 GB free on /dev/shm or here: --layers 3 (2 MoE layers)"
fi
echo "== synth deepseek-v3-shaped fp8 --layers $layers --dense-layers 1 -> $src"
t "$bin" fixture synth --preset deepseek-v3-shaped --dtype fp8 --num-layers "$layers" --dense-layers 1 --no-progress "$src" || exit 1
echo "== fuse-shared --tp 8 -> $dst"
t "$bin" fuse-shared --tp 8 --no-progress "$src" "$dst" || exit 1
du -sh "$src" "$dst"
echo "== warm the page cache: cat every file once"
t sh -c "find '$src' '$dst' -type f -exec cat {} + >/dev/null"
free -g | sed 's/^/  /'
echo "== validate --device cuda --cpu-check none --tokens 64 --io-baseline $*"
s=$SECONDS
"$bin" validate --device cuda --cpu-check none --tokens 64 --io-baseline -o "$out/report.json" "$@" "$src" "$dst" \
	2> >(tee "$out/progress.log" >&2) | tee "$out/report.txt"
rc=${PIPESTATUS[0]}
echo "  -> validate rc=$rc in $((SECONDS - s))s"
python3 - "$out/report.json" <<'EOF' || true
import json, sys
r = json.load(open(sys.argv[1]))
worst = 0
for t in r.get("timings", []):
    gb = (t["dst_bytes"] + t["src_bytes"]) / 1e9
    base = t.get("io_baseline_seconds", 0)
    ratio = t.get("ratio", 0)
    worst = max(worst, ratio)
    print(f"layer {t['layer']}: validate {t['wall_seconds']:.2f} s, read+copy {base:.2f} s "
          f"({gb:.2f} GB, {gb / base if base else 0:.2f} GB/s), ratio {ratio:.2f} "
          f"(dst io {t['dst_io_seconds']:.2f} s, waited {t['bank_wait_seconds']:.2f} s; "
          f"src io {t['src_io_seconds']:.2f} s; compute {t['compute_seconds']:.3f} s)")
print(f"worst ratio {worst:.2f} (target <= 1.5): {'met' if 0 < worst <= 1.5 else 'MISSED'}")
EOF
exit "$rc"
