#!/usr/bin/env bash
# Creates (or reuses) a virtualenv and installs lightning-zerocopy into it, built from source.
# Usage: bash scripts/setup_env.sh [VENV_DIR]     (default: .venv in the repository root)
# torch is pinned first: an unpinned torch pulls several GB of CUDA packages on a CPU machine.
# Set TORCH_SPEC to install another torch (e.g. TORCH_SPEC="torch==2.11.0").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip setuptools wheel
"$py" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}" ninja numpy
cd "$root"
# --no-build-isolation: compile against the torch installed above.
MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$py" -m pip install -q --no-build-isolation -e ".[test]"
"$py" -c "import lightning_zerocopy as lz; print(f'lightning-zerocopy {lz.__version__} ready (CUDA kernels: {lz.WITH_CUDA})')"
