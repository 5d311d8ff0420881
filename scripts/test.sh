#!/usr/bin/env bash
# Sets up the virtualenv (scripts/setup_env.sh; skipped while it is current) and runs the test suite.
# Extra arguments go to pytest.
# CUDA tests are skipped without a GPU; scripts/gpu_check.sh runs them on a GPU machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"
bash "$root/scripts/setup_env.sh" "$venv"
cd "$root"
"$venv/bin/python" -m pytest -q tests "$@"
