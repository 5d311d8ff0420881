#!/usr/bin/env bash
# Issue 37's speed gate: the same e2e rows on an older tree and on this one, in one machine start, interleaved
# (this tree, the older tree, this tree again, then this tree's extra rows) so that the run-to-run spread shows beside the difference.
#
# Run on the GPU machine after `GPU_CHECK_STAGES=build bash scripts/gpu_session.sh` (which installs the carried
# wheels into /tmp/site and builds this tree). The older tree is a plain copy (no .git) carried beside this one:
#   git -C <repo> archive <sha> | tar x -C .before      # here; then carry ".before"
#
# Environment:
#   SPEED_GATE_BEFORE   the older tree (default .before)
#   SPEED_GATE_KIND     e2e (default): the homogeneous rows of benchmarks.end_to_end; hetero: benchmarks.end_to_end.hetero's rows
#   SPEED_GATE_ARGS     the benchmark's arguments (defaults below: the 24M-node graph of issue 40, fp32, both models)
#   SPEED_GATE_CONFIGS_BEFORE  the rows run on both trees (default zc_gpu_mps)
#   SPEED_GATE_CONFIGS_EXTRA   rows run on this tree alone, last (default model_only; empty: none)
#   SPEED_GATE_ORDER    the interleaved runs (default "after before again"; e.g. "after before again before2" for a
#                       second run of the older tree: a name starting with "before" runs the older tree)
#   OUT                 where the reports go ($OUT/gate_<kind>_{after,before,again,extra})
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
before="$(cd "${SPEED_GATE_BEFORE:-$root/.before}" && pwd)"
kind="${SPEED_GATE_KIND:-e2e}"
OUT="${OUT:-$root/results/speed_gate}"
mkdir -p "$OUT"
site="/tmp/site"
if [[ "$kind" == e2e ]]; then
  module=benchmarks.end_to_end
  args="${SPEED_GATE_ARGS:---preset issue20 --num-nodes 24000000 --avg-degree 12 --features 100 --classes 47 --precision 32-true --steps 300 --warmup 30 --row-budget-s 14}"
else
  module=benchmarks.end_to_end.hetero
  args="${SPEED_GATE_ARGS:---num-neighbors 10,10,10 --row-budget-s 30}"
fi
after_configs="${SPEED_GATE_CONFIGS_EXTRA-model_only}"  # rows of this tree alone, last (empty: none)
before_configs="${SPEED_GATE_CONFIGS_BEFORE:-zc_gpu_mps}"

echo "== building the older tree ($before)"
(cd "$before" && CXX=/usr/bin/g++ CC=/usr/bin/gcc python3 setup.py build_ext --inplace >"$OUT/gate_before_build.log" 2>&1) \
  || { echo "the older tree did not build: $OUT/gate_before_build.log"; exit 1; }

# The e2e benchmark was benchmarks.e2e before benchmarks/ was grouped by question (benchmarks.end_to_end since).
module_in() {  # tree
  if [[ "$kind" == e2e && ! -d "$1/benchmarks/end_to_end" ]]; then echo benchmarks.e2e
  elif [[ "$kind" != e2e && ! -d "$1/benchmarks/end_to_end" ]]; then echo benchmarks.e2e.hetero
  else echo "$module"; fi
}

run() {  # tree, cache, configs, name
  local tree_module; tree_module="$(module_in "$1")"
  echo "== $4: $tree_module $3 in $1"
  (cd "$1" && PYTHONPATH="$1:$site" timeout -s TERM "${SPEED_GATE_ROW_TIMEOUT:-240}" python3 -m $tree_module $args \
     --configs "$3" --cache-dir "$2" --out "$OUT/gate_${kind}_$4" >"$OUT/gate_${kind}_$4.log" 2>&1)
  echo "   exit $? ($4)"
}
# Each tree keeps its own dataset cache: an older tree may not read a newer cache format.
for name in ${SPEED_GATE_ORDER:-after before again}; do
  if [[ "$name" == before* ]]; then run "$before" /tmp/lzc_before "$before_configs" "$name"
  else run "$root" /tmp/lzc "$before_configs" "$name"; fi
done
[[ -n "$after_configs" ]] && run "$root" /tmp/lzc "$after_configs" extra
