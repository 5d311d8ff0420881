#!/usr/bin/env bash
# Creates (or reuses) a virtualenv and installs lightning-zerocopy into it, built from source.
# Usage: bash scripts/setup_env.sh [VENV_DIR]     (default: .venv in the repository root)
# torch is pinned first: an unpinned torch pulls several GB of CUDA packages on a CPU machine.
# Set TORCH_SPEC to install another torch (e.g. TORCH_SPEC="torch==2.11.0").
#
# Set-up is skipped when the venv is current: same torch spec, same build inputs (csrc/, setup.py,
# pyproject.toml), the same checkout installed, and the extension imports. Python sources need no reinstall:
# the install is editable, so lightning_zerocopy/**/*.py is read from this checkout. LZC_REINSTALL=1 forces it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv}"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
stamp="$venv/.lightning_zerocopy-setup"
cd "$root"

# What the installed build depends on: the torch spec and every build input (file names and contents).
build_key() {
  local inputs=()
  for path in csrc setup.py pyproject.toml; do [ -e "$path" ] && inputs+=("$path"); done
  {
    echo "torch: $torch_spec; FORCE_CUDA=${FORCE_CUDA:-}; FORCE_CPU=${FORCE_CPU:-}; root: $root"
    find "${inputs[@]}" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
}
key="$(build_key)"
py="$venv/bin/python"

if [ "${LZC_REINSTALL:-0}" != "1" ] && [ -x "$py" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] &&
   "$py" - "$root" <<'EOF' 2>/dev/null
import sys
from pathlib import Path
import lightning_zerocopy, lightning_zerocopy._C  # noqa: F401  (the built extension loads)
sys.exit(0 if Path(lightning_zerocopy.__file__).resolve().parents[1] == Path(sys.argv[1]).resolve() else 1)
EOF
then
  echo "setup: $venv is current ($torch_spec, csrc/ and setup files unchanged); skipping install and build (LZC_REINSTALL=1 forces it)"
  exit 0
fi

if [ ! -x "$py" ]; then
  python3 -m venv "$venv"
fi
rm -f "$stamp"
"$py" -m pip install -q --upgrade pip setuptools wheel
"$py" -m pip install -q "$torch_spec" ninja numpy
# --no-build-isolation: compile against the torch installed above.
MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$py" -m pip install -q --no-build-isolation -e ".[test]"
"$py" -c "import lightning_zerocopy as lz; print(f'lightning-zerocopy {lz.__version__} ready (CUDA kernels: {lz.WITH_CUDA})')"
echo "$key" > "$stamp"
