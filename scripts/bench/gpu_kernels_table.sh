#!/bin/bash
# Issue 52's measurement in one call of at most 10 minutes: Liger Kernel's RMSNorm/RoPE/SwiGLU
# (`learner.liger`) and compiled decoder layers (`learner.compile_layers`) on the Qwen2.5-1.5B shape, each
# setting under the CUDA allocator capped at 78 GiB (an 80 GB card's usable memory), then the 3B shape fully
# fine-tuned within 78 GiB with each. Its settings ran on an H200 in three calls of 389, 162 and 110 s
# (docs/performance.md); the script has not run in one piece. On a bare GPU machine (CUDA torch,
# transformers; no Ray, vLLM or .venv):
#
#   WHEELS=<dir> OUT=<dir> bash scripts/bench/gpu_kernels_table.sh
#
# WHEELS: the DeepSpeed wheel and those of pydantic (+ pydantic_core, annotated_types, typing_inspection),
# hjson and liger_kernel for the machine's Python (../shared/gpu/README.md says how; liger_kernel is pure
# Python, Triton comes with CUDA torch). The longer table of every setting is scripts/bench/gpu_learner_table.sh.
# Writes OUT/liger-agreement.log, OUT/qwen2.5-1.5b-kernels.{json,log}, OUT/qwen2.5-3b-kernels.{json,log}.
set -u
: "${WHEELS:?set WHEELS to the folder of wheels}" "${OUT:?set OUT to a folder for the results}"
mkdir -p "$OUT"
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
need=""
for pair in pydantic:pydantic pydantic_core:pydantic_core annotated_types:annotated_types \
    typing_inspection:typing_inspection hjson:hjson liger_kernel:liger_kernel deepspeed:deepspeed; do
  python3 -c "import ${pair%%:*}" 2>/dev/null || need="$need $(ls "$WHEELS"/"${pair##*:}"-*.whl)"
done
[ -z "$need" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $need || exit 1
export PYTHONPATH=$SITE:$PWD DS_ACCELERATOR=cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers, triton, liger_kernel, deepspeed; print("torch", torch.__version__, "transformers", transformers.__version__, "triton", triton.__version__, "deepspeed", deepspeed.__version__)' 2>&1 | tee -a "$OUT/gpu.txt"
# Liger against eager first: log-probs and gradients of the same 4-layer model, fp32 and bf16.
for dtype in fp32 bf16; do
  timeout 90 python3 -m scripts.probes.liger_agreement configs/architectures/qwen2.5-1.5b --layers 4 --dtype $dtype \
    2>&1 | grep -v Warning | tail -3 | tee -a "$OUT/liger-agreement.log"
done
BASE="learner.dtype=bf16 learner.logprob_chunk_tokens=2048 learner.shared_prefix=false learner.lr=1.0e-6 learner.torch_threads=8"
BENCH="python3 -m scripts.bench.learner --local --shape random --random-init --questions 64 --group 1 --prompt-tokens 512 --response-tokens 512 --steps 3 --memory-gib 78"
# One GPU: ZeRO-0 (ZeRO-2 reduces after every micro-batch, docs/performance.md); 1.5B without recomputation.
S="learner.zero_stage=0,learner.gradient_checkpointing=false"
timeout 330 $BENCH --out "$OUT/qwen2.5-1.5b-kernels.json" learner.model=configs/architectures/qwen2.5-1.5b $BASE \
  --setting "$S,learner.micro_batch_size=8" \
  --setting "$S,learner.micro_batch_size=8,learner.liger=true" \
  --setting "$S,learner.micro_batch_size=8,learner.compile_layers=true" \
  --setting "$S,learner.micro_batch_size=16,learner.liger=true" \
  --setting "$S,learner.micro_batch_size=16,learner.compile_layers=true" \
  2>&1 | grep -v -i "warn" | tee "$OUT/qwen2.5-1.5b-kernels.log"
# 3B fully fine-tuned: with recomputation at 16 sequences a pass, or without it at 4.
R="learner.zero_stage=0,learner.gradient_checkpointing=true,learner.micro_batch_size=16"
timeout 240 $BENCH --out "$OUT/qwen2.5-3b-kernels.json" learner.model=configs/architectures/qwen2.5-3b $BASE \
  --setting "$R,learner.liger=true" \
  --setting "$R,learner.compile_layers=true" \
  --setting "learner.zero_stage=0,learner.gradient_checkpointing=false,learner.micro_batch_size=4,learner.liger=true" \
  2>&1 | grep -v -i "warn" | tee "$OUT/qwen2.5-3b-kernels.log"
