#!/usr/bin/env bash
# Issue 11's conformance run on the GPU machine: transformers writes tiny
# checkpoints of every new family with sizes and seeds the tests never saw
# (export_families.py --unseen), then the moeprep binary runs over each:
# inspect --json, convert in all three layouts, fuse-shared --tp 1/4/8 where
# the family fuses (FP8 variants too), and validate --golden on the CPU and on cuda for every
# output. One line per family x command with the worst rel_l2 against HF.
#
#   here:   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o .gpu/moeprep ./cmd/moeprep
#   device: run(command="bash scripts/gpu-families.sh", carry=[".gpu"])
#
# ERNIE_VL=1 also exports an unseen ERNIE-4.5-VL (export_ernie_vl.py
# --unseen: two routed banks a layer; fuse-shared must refuse it).
# WRAPPERS=name,... also exports those multimodal wrappers
# (export_wrappers.py --unseen; WRAPPERS=all: every one) into the same run.
# Every source is also converted with --orientation in-out (formats packed
# along the row must refuse it) and validated on both devices.
#
# LOWBIT=1 runs issue 29's formats instead: export_lowbit.py --unseen
# quantises unseen gpt_oss, glm4_moe, olmoe and deepseek_v4 checkpoints
# (FAMILIES defaults to those four) to MXFP4 (gpt-oss; compressed-tensors),
# INT4 (Kimi's layout), NVFP4 (ModelOpt; compressed-tensors on the experts
# and, W4A4, on every Linear), ModelOpt MIXED_PRECISION (NVFP4 experts, FP8
# per tensor elsewhere), FP8 per tensor and per channel, and DeepSeek-V4's
# FP4 experts beside FP8 ue8m0 blocks, with goldens from transformers
# (gpt-oss's MXFP4: its own dequantisation); each is also converted with
# --dtype bf16 where the binary has the flag. LOWBIT_ONLY=name,... exports
# only those low-bit checkpoints (names as export_lowbit.py --unseen has them).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(pwd)/.gpu/moeprep
out=${OUT:-/tmp/gpu-families}
work=/tmp/families-unseen
rm -rf "$work" && mkdir -p "$work/out"
[ -n "${LOWBIT:-}" ] && FAMILIES=${FAMILIES:-gpt_oss,glm4_moe,olmoe,deepseek_v4}
PYTHONUNBUFFERED=1 timeout 240 python3 fixtures/hf/export_families.py "$work/src" --unseen --seed 500 ${FAMILIES:+--only "$FAMILIES"} --log "$out/unseen-export.log" >/dev/null 2>&1
echo "export rc=$? ($(tail -1 "$out/unseen-export.log"))"
if [ -n "${WRAPPERS:-}" ]; then
	only=""; [ "$WRAPPERS" != all ] && only="--only $WRAPPERS"
	PYTHONUNBUFFERED=1 timeout 240 python3 fixtures/hf/export_wrappers.py "$work/src" --unseen --seed 700 $only --log "$out/unseen-wrappers-export.log" >/dev/null 2>&1
	echo "wrappers export rc=$? ($(tail -1 "$out/unseen-wrappers-export.log"))"
fi
if [ -n "${ERNIE_VL:-}" ]; then
	PYTHONUNBUFFERED=1 timeout 120 python3 fixtures/hf/export_ernie_vl.py "$work/src" --unseen --seed 700 --log "$out/unseen-ernie-vl-export.log" >/dev/null 2>&1
	echo "ernie-vl export rc=$? ($(tail -1 "$out/unseen-ernie-vl-export.log"))"
fi
requantizable=""
refusing=" ernie4-5-vl-moe inkling-text llama4-text qwen3-next ernie4-5-moe-bias qwen4-exp inkling-mm-model hy-v4 step3p7 "
fusable=" afmoe ernie4-5-moe exaone-moe glm4-moe glm4-moe-lite hy-v3 granitemoeshared granitemoe-swa cohere2-moe deepseek-v4 dots1 solar-open hunyuan-v1-moe granitemoehybrid axk1 axk2 deepseek-v32 glm-moe-dsa mistral4 kimi-linear laguna aria minimax-m3-vl deepseek-ocr2 glm5-next glm4v-moe kimi-k25 nemotron-h "
if [ -n "${LOWBIT:-}" ]; then
	mv "$work/src" "$work/bf16"
	PYTHONUNBUFFERED=1 timeout 480 python3 fixtures/hf/export_lowbit.py "$work/bf16" "$work/src" --unseen --seed 900 ${LOWBIT_ONLY:+--only "$LOWBIT_ONLY"} --log "$out/unseen-lowbit-export.log" >/dev/null 2>&1
	echo "lowbit export rc=$? ($(tail -1 "$out/unseen-lowbit-export.log"))"
	# routed and shared stored unlike (INT4 beside BF16, FP4 beside FP8):
	# fusing would requantise the shared expert
	refusing=" glm4-moe-int4 deepseek-v4-fp4 "
	requantizable=" glm4-moe-int4 "
	fusable=" glm4-moe-nvfp4 glm4-moe-fp8-tensor glm4-moe-nvfp4-ct glm4-moe-mxfp4-ct glm4-moe-nvfp4-mixed "
fi
dtype=""
"$bin" convert --help 2>/dev/null | grep -q -- "--dtype" && dtype=bf16
worst() { python3 -c "
import json,sys
r=json.load(open(sys.argv[1])); w=0
for row in r['layers']:
    if 'golden' in row['check']: w=max(w,row['rel_l2'])
print(f'{w:.2e}')" "$1" 2>/dev/null || echo "-"; }
printf '%-14s %-26s %-6s %s\n' family command result worst_rel_l2_vs_HF | tee "$out/table.txt"
for src in "$work"/src/*/; do
	n=$(basename "$src")
	line() { printf '%-14s %-26s %-6s %s\n' "$n" "$1" "$2" "$3" | tee -a "$out/table.txt"; }
	if "$bin" inspect --json "$src" >"$work/out/$n-inspect.json" 2>"$work/out/err"; then line "inspect --json" ok "$(python3 -c "import json;j=json.load(open('$work/out/$n-inspect.json'));print(j['model_type'],'E',j['num_experts'],'k',j['top_k'],'layers',j['moe_layers'])")"; else line inspect FAIL "$(head -c 150 "$work/out/err")"; continue; fi
	dsts=()
	for lay in stacked gate-up up-gate; do
		d="$work/out/$n-$lay"
		if "$bin" convert --no-progress --layout "$lay" "$src" "$d" >/dev/null 2>"$work/out/err"; then dsts+=("$d:convert --layout $lay")
		elif [ "$lay" != stacked ] && grep -q "no gate rows to fuse" "$work/out/err"; then line "convert $lay" refused "expected (ungated experts): $(head -c 100 "$work/out/err")"
		else line "convert $lay" FAIL "$(head -c 150 "$work/out/err")"; fi
	done
	d="$work/out/$n-in-out"
	if "$bin" convert --no-progress --orientation in-out "$src" "$d" >/dev/null 2>"$work/out/err"; then
		dsts+=("$d:convert --orientation in-out")
	elif grep -q "no byte-exact transpose" "$work/out/err"; then
		line "convert in-out" refused "expected: $(head -c 120 "$work/out/err")"
	else
		line "convert in-out" FAIL "$(head -c 150 "$work/out/err")"
	fi
	if [ -n "${LOWBIT:-}" ] && [ -n "$dtype" ]; then
		d="$work/out/$n-dtype"
		if "$bin" convert --no-progress --dtype "$dtype" "$src" "$d" >/dev/null 2>"$work/out/err"; then dsts+=("$d:convert --dtype $dtype"); else line "convert --dtype $dtype" FAIL "$(head -c 150 "$work/out/err")"; fi
	fi
	if [[ $refusing == *" $n "* ]]; then # a shared expert fuse-shared must refuse, exit 2, naming why
		"$bin" fuse-shared --tp 1 --no-progress "$src" "$work/out/$n-refused" >/dev/null 2>"$work/out/err"
		rc=$?
		if [ $rc -eq 2 ] && [ ! -e "$work/out/$n-refused" ]; then line "fuse-shared --tp 1" refused "expected: $(head -c 120 "$work/out/err")"; else line "fuse-shared --tp 1" FAIL "rc $rc: $(head -c 120 "$work/out/err")"; fi
		# LOWBIT: a BF16 shared expert beside INT4 routed ones fuses when
		# asked to requantise it (compressed-tensors' rule).
		if [ -n "${LOWBIT:-}" ] && [[ $requantizable == *" $n "* ]]; then
			for tp in 1 4 8; do
				d="$work/out/$n-rq$tp"
				if "$bin" fuse-shared --requantize-shared --tp "$tp" --no-progress "$src" "$d" >/dev/null 2>"$work/out/err"; then dsts+=("$d:fuse-shared --requantize-shared --tp $tp"); else line "fuse-shared --requantize-shared --tp $tp" FAIL "$(head -c 150 "$work/out/err")"; fi
			done
		fi
	fi
	if [[ $fusable == *" ${n%-fp8} "* ]]; then
		for tp in 1 4 8; do
			d="$work/out/$n-tp$tp"
			if "$bin" fuse-shared --tp "$tp" --no-progress "$src" "$d" >/dev/null 2>"$work/out/err"; then
				dsts+=("$d:fuse-shared --tp $tp")
			elif grep -q "not a multiple of the FP8 block\|use --fold-scaling auto or none" "$work/out/err"; then
				line "fuse-shared --tp $tp" refused "expected: $(head -c 120 "$work/out/err")"
			else
				line "fuse-shared --tp $tp" FAIL "$(head -c 150 "$work/out/err")"
			fi
		done
	fi
	# One nibble of one routed expert's weight flipped in a copy of the
	# first output: validate must fail (exit 1) on both devices.
	if [ ${#dsts[@]} -gt 0 ]; then
		first=${dsts[0]%%:*}
		mut="$work/out/$n-mutated"
		rm -rf "$mut" && cp -r "$first" "$mut"
		if what=$(python3 - "$mut" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    if not f.endswith(".safetensors"):
        continue
    p = os.path.join(d, f)
    with open(p, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        hdr = json.loads(fh.read(n))
        # a second routed bank (ERNIE-4.5-VL's vision_moe) first: its
        # tokens are the ones a one-bank check would not run
        for name, t in sorted(hdr.items(), key=lambda kv: ("vision_moe" not in kv[0], kv[0])):
            if name == "__metadata__" or "experts" not in name or "scale" in name or "bias" in name:
                continue
            b, e = t["data_offsets"]
            if e - b < 64 or t["dtype"] not in ("BF16", "F8_E4M3", "U8", "I32", "I8", "F32", "F16"):
                continue
            at = 8 + n + b + (e - b) // 3
            fh.seek(at); v = fh.read(1)[0]
            fh.seek(at); fh.write(bytes([v ^ 0x0F]))
            print(f"{name} byte {(e - b) // 3}")
            sys.exit(0)
sys.exit(1)
PY
); then
			for dev in cpu cuda; do
				timeout 120 "$bin" validate --device "$dev" --no-progress -o "$mut-$dev.json" "$src" "$mut" --golden "$src" >/dev/null 2>"$work/out/err"
				rc=$?
				if [ $rc -eq 1 ]; then line "mutated ($dev)" caught "$what"; else line "mutated ($dev)" FAIL "rc $rc, want 1: $what"; fi
			done
		fi
	fi
	for entry in "${dsts[@]}"; do
		d=${entry%%:*}; what=${entry#*:}
		for dev in cpu cuda; do
			timeout 120 "$bin" validate --device "$dev" --no-progress -o "$d-$dev.json" "$src" "$d" --golden "$src" >/dev/null 2>"$work/out/err"
			rc=$?
			res=pass; [ $rc -ne 0 ] && res="FAIL$rc"
			if [ $rc -eq 2 ] && grep -q "decodes out-in stacks only" "$work/out/err"; then
				line "$what ($dev)" refused "expected: $(head -c 120 "$work/out/err")"
				continue
			fi
			[ $rc -eq 2 ] && line "$what ($dev)" "FAIL2" "$(head -c 150 "$work/out/err")" && continue
			line "$what ($dev)" "$res" "$(worst "$d-$dev.json")"
		done
	done
done
echo "== $(grep -c ' pass ' "$out/table.txt") pass, $(grep -c ' FAIL' "$out/table.txt") fail, $(grep -c ' refused ' "$out/table.txt") refused as expected, $(grep -c ' caught ' "$out/table.txt") mutations caught"
