#!/usr/bin/env bash
# Sets up the virtualenv (scripts/setup_env.sh; skipped while it is current), trains the quickstart recipe on
# the CPU, then evaluates the checkpoint on the held-out test nodes. Extra arguments go to `lightning-zerocopy fit`
# (e.g. --trainer.max_epochs=2). Outputs land in ./lightning_logs/quickstart/version_N/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv}"
bash "$root/scripts/setup_env.sh" "$venv"
cd "$root"
recipe="recipes/quickstart.yaml"
start=$(date +%s)
"$venv/bin/lightning-zerocopy" fit --config "$recipe" "$@"
# `last`: the newest last.ckpt of this recipe's runs (lightning_logs/quickstart/), i.e. the run above
"$venv/bin/lightning-zerocopy" test --config "$recipe" --ckpt_path last
echo "quickstart: fit + test took $(( $(date +%s) - start )) s (checkpoints: lightning_logs/quickstart/)"
