#!/usr/bin/env bash
# The project's test command: build/refresh .venv, then run the whole pytest suite (CPU only).
# Needs the data pack: SEARCHRL_DATA (defaults to ../shared/data beside the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/setup.sh
# tests/conftest.py prints the suite's minutes at the end, this set-up's included.
export SEARCHRL_TEST_SETUP_S=$(( $(date +%s) - t0 ))
export SEARCHRL_DATA="${SEARCHRL_DATA:-$(cd .. && pwd)/shared/data}"
# DeepSpeed JIT-builds its CPU shm op into TORCH_EXTENSIONS_DIR; one per .venv, so two checkouts on a
# machine never rebuild the same .so under each other's running processes (seen: a hang on its lock).
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m pytest "$@"
