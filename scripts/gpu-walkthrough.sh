#!/usr/bin/env bash
# README's first-screen walk (download, inspect, convert, validate, load), as a newcomer runs
# it, on the GPU machine (it has transformers; nothing outside it can be reached, so the
# download is replaced by a Hugging Face cache entry holding the qwen3-moe checkpoint
# transformers wrote). Here: CGO_ENABLED=0 go build -o .gpu/moeprep ./cmd/moeprep
# There: run(command="bash scripts/gpu-walkthrough.sh", carry=[".gpu"])
set -euo pipefail
root=$(pwd); mp=$(realpath "${MOEPREP:-.gpu/moeprep}")
w=$(mktemp -d); export HF_HOME=$w/hf; cd $w
snap=$HF_HOME/hub/models--Qwen--Qwen3-30B-A3B/snapshots/0123456789abcdef0123456789abcdef01234567
mkdir -p $snap $HF_HOME/hub/models--Qwen--Qwen3-30B-A3B/refs
cp -r $root/fixtures/hf/qwen3-moe/. $snap/
printf 0123456789abcdef0123456789abcdef01234567 > $HF_HOME/hub/models--Qwen--Qwen3-30B-A3B/refs/main
echo '$ moeprep inspect Qwen/Qwen3-30B-A3B'; $mp inspect Qwen/Qwen3-30B-A3B 2>&1 | head -12
echo '$ moeprep convert --layout transformers Qwen/Qwen3-30B-A3B ./qwen3-tf'; $mp convert --no-progress --layout transformers Qwen/Qwen3-30B-A3B ./qwen3-tf 2>&1 | tail -6
echo '$ moeprep validate --junit validate.xml Qwen/Qwen3-30B-A3B ./qwen3-tf'; $mp validate --no-progress --junit validate.xml Qwen/Qwen3-30B-A3B ./qwen3-tf 2>&1 | tail -8; echo "exit $?"
head -c 400 validate.xml; echo
echo "\$ python3 -c \"import transformers as t; t.AutoModelForCausalLM.from_pretrained('./qwen3-tf')\""
python3 -c "import transformers as t; m=t.AutoModelForCausalLM.from_pretrained('./qwen3-tf'); print('loaded', type(m).__name__, t.__version__)" 2>&1 | tail -3
python3 $root/fixtures/hf/interop.py $snap ./qwen3-tf --expect-fused 2>&1 | tail -2
