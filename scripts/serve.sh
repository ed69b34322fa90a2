#!/usr/bin/env bash
# Serve a trained searcher: bash scripts/serve.sh PATH [--config FILE] [key=value ...]
# PATH: a run directory, a checkpoints/step-N directory, a model directory or a model name.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/serve.sh PATH [--config FILE] [key=value ...]" >&2
  exit 2
fi
checkpoint="$1"
shift
exec .venv/bin/python -m scripts.serve --checkpoint "$checkpoint" "$@"
