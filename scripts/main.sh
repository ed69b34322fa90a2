#!/usr/bin/env bash
# The main job: build/refresh .venv, build the sharded index over the data pack's corpus (resumes,
# skips when done), then search it (scripts.search_demo). Extra arguments are config overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SEARCHRL_DATA="${SEARCHRL_DATA:-$(cd .. && pwd)/shared/data}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python -m scripts.search_demo "$@"
