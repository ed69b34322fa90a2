#!/usr/bin/env bash
# The main job: build/refresh .venv, index the data pack's corpus (once; resumes), train a searcher on the
# embedded CPU default (configs/main_cpu.yaml: Search-R1 on Gemma 3 270M, an expert warm start, then GRPO on
# exact match), evaluate it against the untrained model, the warm start only, naive RAG and direct inference on
# the test split, and print the summary
# (scripts.main). Extra arguments go to scripts.main (--config FILE, --eval-limit N, key=value overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/setup.sh
export SEARCHRL_SETUP_S=$(( $(date +%s) - t0 ))
export SEARCHRL_DATA="${SEARCHRL_DATA:-$(cd .. && pwd)/shared/data}"
# DeepSpeed JIT-builds its CPU shm op into TORCH_EXTENSIONS_DIR; one per .venv, so two checkouts on a
# machine never rebuild the same .so under each other's running processes (seen: a hang on its lock).
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m scripts.main "$@"
