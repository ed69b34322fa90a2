#!/bin/bash
# The learner's GPU table (docs/performance.md, "On one GPU"): scripts.bench.learner --local on the Qwen2.5
# 1.5B and 3B shapes (random init, random ids: no weights, tokenizer or data pack), on a bare GPU machine
# whose image has CUDA torch, transformers and peft but no Ray, vLLM or .venv.
#
#   WHEELS=<dir> OUT=<dir> bash scripts/bench/gpu_learner_table.sh
#
# WHEELS holds the DeepSpeed wheel and, under py3.X/, the wheels of the modules the image may lack
# (pydantic and its parts, hjson, ...): how to build them is in ../shared/gpu/README.md; for the Liger settings
# (learner.liger) also liger_kernel, a pure-Python wheel (`pip download --no-deps liger-kernel`; Triton comes
# with CUDA torch). Only the
# missing ones are installed, into a temporary --target folder (nothing system-wide). The 3B settings
# cap the CUDA allocator at 78 GiB (--memory-gib), an 80 GB card's usable memory, on a larger GPU.
set -u
: "${WHEELS:?set WHEELS to the folder of wheels}" "${OUT:?set OUT to a folder for the results}"
mkdir -p "$OUT"
SITE=$(mktemp -d)
PYV=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
need=""
for pair in pydantic:pydantic pydantic_core:pydantic_core annotated_types:annotated_types \
    typing_inspection:typing_inspection hjson:hjson cpuinfo:py_cpuinfo msgpack:msgpack einops:einops psutil:psutil \
    liger_kernel:liger_kernel; do
  python3 -c "import ${pair%%:*}" 2>/dev/null || need="$need $(ls "$WHEELS"/py"$PYV"/"${pair##*:}"-*.whl)"
done
python3 -c "import deepspeed" 2>/dev/null || need="$need $(ls "$WHEELS"/deepspeed-*.whl)"
[ -z "$need" ] || python3 -m pip install -q --no-index --no-deps --target "$SITE" $need
export PYTHONPATH=$SITE:$PWD DS_ACCELERATOR=cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# Liger against eager first: log-probs and gradients of the same model (issue 52).
python3 -m scripts.probes.liger_agreement configs/architectures/qwen2.5-1.5b --layers 4 2>&1 | tee "$OUT/liger-agreement.log"
python3 -m scripts.probes.liger_agreement configs/architectures/qwen2.5-1.5b --layers 4 --dtype bf16 2>&1 | tee -a "$OUT/liger-agreement.log"
BASE="learner.dtype=bf16 learner.zero_stage=2 learner.logprob_chunk_tokens=2048 learner.shared_prefix=false learner.lr=1.0e-6 learner.torch_threads=8"
BENCH="python3 -m scripts.bench.learner --local --shape random --random-init --questions 64 --group 1 --prompt-tokens 512 --response-tokens 512 --steps 3"
$BENCH --out "$OUT/qwen2.5-1.5b.json" --profile "$OUT/profiles" learner.model=configs/architectures/qwen2.5-1.5b $BASE \
  --setting "learner.gradient_checkpointing=true,learner.micro_batch_size=16" \
  --setting "learner.gradient_checkpointing=false,learner.micro_batch_size=16" \
  --setting "learner.zero_stage=0,learner.gradient_checkpointing=false,learner.micro_batch_size=16" \
  --setting "learner.gradient_checkpointing=false,learner.micro_batch_size=8" \
  --setting "learner.zero_stage=0,learner.gradient_checkpointing=false,learner.micro_batch_size=8" \
  --setting "learner.gradient_checkpointing=false,learner.micro_batch_size=4" \
  --setting "learner.zero_stage=0,learner.gradient_checkpointing=false,learner.micro_batch_size=4" \
  --setting "learner.zero_stage=0,learner.gradient_checkpointing=false,learner.micro_batch_size=8,learner.compile_layers=true" \
  --setting "learner.zero_stage=0,learner.gradient_checkpointing=false,learner.micro_batch_size=16,learner.compile_layers=true" \
  --setting "learner.zero_stage=0,learner.gradient_checkpointing=false,learner.micro_batch_size=8,learner.liger=true" \
  --setting "learner.zero_stage=0,learner.gradient_checkpointing=false,learner.micro_batch_size=16,learner.liger=true" \
  2>&1 | tee "$OUT/qwen2.5-1.5b.log"
$BENCH --out "$OUT/qwen2.5-1.5b-78gib.json" --memory-gib 78 learner.model=configs/architectures/qwen2.5-1.5b $BASE \
  --setting "learner.gradient_checkpointing=auto,learner.micro_batch_tokens=16384" 2>&1 | tee "$OUT/qwen2.5-1.5b-78gib.log"
$BENCH --out "$OUT/qwen2.5-3b-78gib.json" --memory-gib 78 learner.model=configs/architectures/qwen2.5-3b $BASE \
  --setting "learner.gradient_checkpointing=true,learner.micro_batch_size=4" \
  --setting "learner.gradient_checkpointing=auto,learner.micro_batch_tokens=8192" \
  --setting "learner.gradient_checkpointing=true,learner.micro_batch_size=8,learner.lora={rank: 16, alpha: 32}" \
  --setting "learner.gradient_checkpointing=auto,learner.micro_batch_tokens=16384,learner.lora={rank: 16, alpha: 32}" \
  --setting "learner.gradient_checkpointing=auto,learner.micro_batch_tokens=8192,learner.liger=true" \
  --setting "learner.gradient_checkpointing=auto,learner.micro_batch_tokens=8192,learner.compile_layers=true" \
  2>&1 | tee "$OUT/qwen2.5-3b-78gib.log"
rm -rf "$SITE"
