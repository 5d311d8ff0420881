#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU, builds the extension with its CUDA kernels, runs the whole test
# suite with REQUIRE_CUDA=1 (a skipped CUDA test fails), runs the benchmarks, and writes one results JSON.
#
# Usage (repository root, on the GPU machine):
#   GPU_CHECK_COMMIT=<git sha> GPU_CHECK_STAGES=build,tests,gather,sampling bash scripts/gpu_check.sh
#
# Environment:
#   GPU_CHECK_STAGES  comma-separated stages to run (default: build,tests,gather,sampling). Stages:
#                       build     pip-install the carried wheels (.wheels/*.whl), unpack the PyG baseline
#                                 (.pyg/*.tgz), `python3 setup.py build_ext --inplace` with the CUDA kernels
#                       tests     REQUIRE_CUDA=1 python3 -m pytest -q tests
#                       gather    python3 -m benchmarks.parts.gather (zero-copy gather vs baselines; host table >= 8 GiB)
#                       sampling  python3 -m benchmarks.parts.sampling (SEPS: cpu, pyg, gpu, uva)
#                       pipeline  python3 -m benchmarks.parts.pipeline (training steps/s with/without the pipeline, MPS splits;
#                                 not in the default list: GPU_CHECK_STAGES=...,pipeline)
#                       scaling   python3 -m benchmarks.scaling: 1, 2, 4 and 8 GPUs (those this machine has) x policies
#                                 replicate, clique, auto x budgets 10 % / 30 %: epoch time, speed-up, hit rates,
#                                 local/peer/host rows, host PSS per rank, `nvidia-smi topo -m` (not in the default
#                                 list: GPU_CHECK_STAGES=build,scaling on a multi-GPU machine)
#                       step      python3 -m benchmarks.parts.step (ms per training step on pre-staged batches: plain loop, bare
#                                 module, ours, telemetry, bf16, trimmed, compiled; issue 20's graph)
#                       e2e       python3 -m benchmarks.end_to_end --preset issue20 (end to end vs model-only vs PyG, both models)
#                       link      python3 -m benchmarks.end_to_end.link --preset gpu (link prediction vs PyG's LinkNeighborLoader)
#   GPU_CHECK_TEST_PATHS  what the tests stage runs (default: tests)
#   GPU_CHECK_COMMIT  the commit being checked (the device copy of the tree may have no .git)
#   GPU_CHECK_TEST_WORKERS  pytest-xdist workers for the tests (default 0 = one process)
#   OUT               where logs and gpu_results.json go (default: results/gpu_check)
#   GPU_CHECK_GATHER_ARGS / GPU_CHECK_SAMPLING_ARGS / GPU_CHECK_PIPELINE_ARGS / GPU_CHECK_SCALING_ARGS /
#   GPU_CHECK_STEP_ARGS / GPU_CHECK_E2E_ARGS / GPU_CHECK_LINK_ARGS /
#   GPU_CHECK_PYTEST_ARGS
#                     override each stage's arguments
#   GPU_CHECK_EXTRA_STAGE_<NAME>  a shell command run as stage NAME (e.g. a pipeline benchmark appended later);
#                     its stdout/stderr go to $OUT/<name>.log and, if it writes $OUT/<name>.json, that file is
#                     merged into gpu_results.json under benchmarks.<name>
#
# Exit status: non-zero if the build fails (later stages are then skipped) or any test fails.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/results/gpu_check}"
mkdir -p "$OUT"
stages=",${GPU_CHECK_STAGES:-build,tests,gather,sampling},"
commit="${GPU_CHECK_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
export PYTHONUNBUFFERED=1
# every failing test's report, written when it fails (tests/conftest.py): a stage cut by its timeout keeps them
export LZC_TEST_FAILURE_LOG="${LZC_TEST_FAILURE_LOG:-$OUT/failures.log}"
# The extension is built in place, not installed: subprocesses that tests start (DDP ranks, worker scripts, the
# CLI entry point) find the package through PYTHONPATH.
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
status_json="$OUT/stages.tsv"
: >"$status_json"
overall=0

want() { [[ "$stages" == *",$1,"* ]]; }
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$status_json"; }  # stage, exit code, seconds

# --- environment: carried wheels (jsonargparse for LightningCLI) and the PyG baseline backends --------------
if compgen -G ".wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheels/*.whl >"$OUT/build.log" 2>&1 || true
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
pyg_site=""
if compgen -G ".pyg/*.tgz" >/dev/null; then
  mkdir -p /tmp/pygsite && tar xzf .pyg/*.tgz -C /tmp/pygsite && pyg_site=/tmp/pygsite
fi

python3 - <<'EOF' | tee -a "$OUT/build.log"
import torch, subprocess
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
print(subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1])
EOF

# --- build ----------------------------------------------------------------------------------------------------
if want build; then
  start=$SECONDS
  # Compiler: the GPU image sets CXX=/opt/gcc/bin/g++, whose links put a private static libstdc++ into _C.so
  # (ldd shows no libstdc++.so): a C++ exception thrown by an op (every TORCH_CHECK that fails) then crossed
  # two C++ runtimes and segfaulted the process (seen 2026-11-22 on an H200 machine). The system g++ links the
  # one shared libstdc++ torch also uses. Override with GPU_CHECK_CXX / GPU_CHECK_CC.
  export CXX="${GPU_CHECK_CXX:-$(command -v g++ || echo "${CXX:-c++}")}" CC="${GPU_CHECK_CC:-$(command -v gcc || echo "${CC:-cc}")}"
  export LDSHARED="$CXX -shared"
  echo "== build: python3 setup.py build_ext --inplace (CUDA kernels; CXX=$CXX)" | tee -a "$OUT/build.log"
  rm -rf build/temp.* lightning_zerocopy/_C*.so
  FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
    python3 setup.py build_ext --inplace >>"$OUT/build.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    ldd lightning_zerocopy/_C*.so | grep -E "libstdc|libgcc_s|libgomp" | tee -a "$OUT/build.log"
    # An op's error must reach Python as an exception, not kill the process.
    python3 -c "
import torch, lightning_zerocopy.ops as ops
try:
    ops.gather_rows(torch.empty(0, 4), torch.tensor([0]))
except IndexError as e:
    print('op errors reach Python:', type(e).__name__)
" 2>&1 | tee -a "$OUT/build.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "an op's C++ exception crashed the interpreter: see build.log"; rc=99; }
  fi
  record build $rc $((SECONDS - start))
  if [ $rc -ne 0 ]; then
    echo "BUILD FAILED (exit $rc); errors:"
    grep -E "error|Error" "$OUT/build.log" | head -60
    overall=1
    stages=",none,"
  else
    grep -E "lightning-zerocopy: building|copying .*_C" "$OUT/build.log"
    python3 -c "import lightning_zerocopy as lz; print('built _C, CUDA kernels:', lz.WITH_CUDA)" 2>&1 | tee -a "$OUT/build.log"
  fi
fi

# --- tests ----------------------------------------------------------------------------------------------------
if want tests; then
  start=$SECONDS
  echo "== tests: REQUIRE_CUDA=1 python3 -m pytest -q tests"
  # GPU_CHECK_TEST_WORKERS=N (N > 0) runs test files in N pytest-xdist processes: faster, and a crash fails the
  # test that crashed instead of ending the run; off by default (MPS/IPC tests may not like neighbours).
  xdist=""
  if [ "${GPU_CHECK_TEST_WORKERS:-0}" -gt 0 ] && python3 -c "import xdist" 2>/dev/null; then
    xdist="-n $GPU_CHECK_TEST_WORKERS --dist loadfile"
  fi
  # shellcheck disable=SC2086
  # shellcheck disable=SC2086
  REQUIRE_CUDA=1 timeout "${GPU_CHECK_TEST_TIMEOUT:-420}" python3 -m pytest ${GPU_CHECK_TEST_VERBOSITY:--q} -rfE ${GPU_CHECK_TEST_PATHS:-tests} -p no:cacheprovider $xdist \
    --junitxml="$OUT/junit.xml" ${GPU_CHECK_PYTEST_ARGS:-} >"$OUT/tests.log" 2>&1
  rc=$?
  record tests $rc $((SECONDS - start))
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -40
  tail -3 "$OUT/tests.log"
  [ $rc -ne 0 ] && overall=1
fi

# Extra stages (e.g. tests that must run one at a time, a benchmark appended later), right after the tests, in the
# order GPU_CHECK_STAGES lists them (hetero_prep before hetero): GPU_CHECK_EXTRA_STAGE_<NAME>="command".
for name in $(echo "$stages" | tr ',' ' '); do
  var="GPU_CHECK_EXTRA_STAGE_$(echo "$name" | tr 'a-z' 'A-Z')"
  [ -n "${!var+set}" ] || continue
  start=$SECONDS
  echo "== $name"
  bash -c "${!var}" >"$OUT/$name.log" 2>&1
  rc=$?
  record "$name" $rc $((SECONDS - start))
  tail -8 "$OUT/$name.log"
done

# --- benchmarks -----------------------------------------------------------------------------------------------
# gather, sampling, pipeline and scaling: each writes $OUT/<name>.json (merged into gpu_results.json) and its output
# to $OUT/<name>.log, whose last lines are printed
json_stage() {  # name, timeout, tail lines, title, module, args
  local name=$1 limit=$2 lines=$3 title=$4 module=$5 args=$6 start=$SECONDS
  echo "== $title"
  # shellcheck disable=SC2086
  timeout "$limit" python3 -m "$module" --out "$OUT/$name.json" $args >"$OUT/$name.log" 2>&1
  record "$name" $? $((SECONDS - start))
  tail -"$lines" "$OUT/$name.log"
}
want gather && json_stage gather "${GPU_CHECK_GATHER_TIMEOUT:-240}" 12 "gather benchmark" benchmarks.parts.gather \
  "${GPU_CHECK_GATHER_ARGS:---table-gib 8 --row-bytes 128,512,2048 --batches 5 --warmup 2}"

# step, e2e and link: each writes a folder (results.json, report.md, plots, logs), which comes back as $OUT/<stage>.tgz
# (with the stage's log); its results.json is merged into gpu_results.json
bench_stage() {  # name, timeout, module, args
  local name=$1 limit=$2 module=$3 args=$4 start=$SECONDS dir=/tmp/gpu_check_bench/$1
  echo "== $name: python3 -m $module $args"
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  timeout -s TERM "$limit" python3 -m "$module" $args --commit "$commit" --out "$dir" >"$dir/$name.log" 2>&1
  local rc=$?
  record "$name" $rc $((SECONDS - start))
  tail -4 "$dir/$name.log"
  [ -f "$dir/results.json" ] && cp "$dir/results.json" "$OUT/$name.json"
  tar czf "$OUT/$name.tgz" -C /tmp/gpu_check_bench "$name"
}
if want step; then
  bench_stage step "${GPU_CHECK_STEP_TIMEOUT:-400}" benchmarks.parts.step "${GPU_CHECK_STEP_ARGS:-}"
fi
if want e2e; then
  bench_stage e2e "${GPU_CHECK_E2E_TIMEOUT:-480}" benchmarks.end_to_end "${GPU_CHECK_E2E_ARGS:---preset issue20} ${pyg_site:+--pyg-site $pyg_site}"
fi
if want link; then
  bench_stage link "${GPU_CHECK_LINK_TIMEOUT:-420}" benchmarks.end_to_end.link "${GPU_CHECK_LINK_ARGS:---preset gpu} ${pyg_site:+--pyg-site $pyg_site}"
fi

want sampling && json_stage sampling "${GPU_CHECK_SAMPLING_TIMEOUT:-200}" 10 "sampling benchmark" \
  benchmarks.parts.sampling "${pyg_site:+--pyg-site $pyg_site} ${GPU_CHECK_SAMPLING_ARGS:---nodes 2000000 --avg-degree 50 --modes gpu,uva,cpu,pyg --threads all --batches 20}"
want pipeline && json_stage pipeline "${GPU_CHECK_PIPELINE_TIMEOUT:-420}" 12 \
  "pipeline benchmark (steps/s: no pipeline, in-process, worker, worker + MPS, GPU-resident bound)" benchmarks.parts.pipeline \
  "${GPU_CHECK_PIPELINE_ARGS:---gib 8 --steps 100 --warmup 15 --config-timeout 100}"
want scaling && json_stage scaling "${GPU_CHECK_SCALING_TIMEOUT:-560}" 16 "scaling benchmark (GPUs x cache policy x budget)" \
  benchmarks.scaling "${GPU_CHECK_SCALING_ARGS:---gpus 1,2,4,8 --policies replicate,clique,auto --budgets 0.1 --pipelines worker --num-nodes 8000000 --epochs 2 --limit-batches 60 --presample-batches 16 --timeout 120 ${pyg_site:+--pyg-gpus 2 --pyg-site $pyg_site}}"

# --- results JSON ---------------------------------------------------------------------------------------------
GPU_CHECK_COMMIT="$commit" OUT="$OUT" python3 - <<'EOF'
import json, os, xml.etree.ElementTree as ET
out = os.environ["OUT"]
res = {"commit": os.environ["GPU_CHECK_COMMIT"], "stages": {}, "tests": None, "benchmarks": {}}
try:
    import torch
    res["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    res["torch"] = torch.__version__
    res["cuda"] = torch.version.cuda
except Exception as exc:  # noqa: BLE001
    res["gpu"] = f"unknown ({exc})"
with open(os.path.join(out, "stages.tsv")) as f:
    for line in f:
        stage, rc, seconds = line.rstrip("\n").split("\t")
        res["stages"][stage] = {"exit_code": int(rc), "seconds": int(seconds)}
junit = os.path.join(out, "junit.xml")
if os.path.exists(junit):
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    cuda = [c for c in suite.iter("testcase") if "cuda" in (c.get("classname") or "")]
    res["tests"] = {"passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"], "failed": n["failures"],
                    "errors": n["errors"], "skipped": n["skipped"], "total": n["tests"],
                    "cuda_test_cases": len(cuda), "failed_ids": failed[:50]}
for name in sorted(os.listdir(out)):
    if name.endswith(".json") and name != "gpu_results.json":
        try:
            with open(os.path.join(out, name)) as f:
                data = json.load(f)
        except Exception:  # noqa: BLE001
            continue
        if name == "gather.json":
            data = {"gpu": data.get("gpu"), "config": data.get("config"), "results": [
                {k: r[k] for k in ("row_bytes", "num_rows", "rows_per_batch_mean", "pages_touched_per_batch_mean",
                                   "rows_per_touched_page", "pages_touched_per_batch_freq_order", "hot_rows", "hot_rows_big", "gbps", "fraction_of_contiguous",
                                   "auto_chose")} for r in data.get("results", [])]}
        res["benchmarks"][name[:-5]] = data
with open(os.path.join(out, "gpu_results.json"), "w") as f:
    json.dump(res, f, indent=2)
print(json.dumps({"commit": res["commit"], "gpu": res.get("gpu"), "stages": res["stages"], "tests": res["tests"]}, indent=1))
EOF
for name in step e2e link; do [ -f "$OUT/$name.tgz" ] && rm -f "$OUT/$name.json"; done  # in gpu_results.json and the .tgz
rm -f "$OUT/stages.tsv"  # merged into gpu_results.json (keeps $OUT within the 8 files that come back)
# The device tool returns at most 8 files: junit.xml (summarised in gpu_results.json) goes first if needed.
[ "$(ls -1 "$OUT" | wc -l)" -gt 8 ] && rm -f "$OUT/junit.xml"
# Still more than 8 files anywhere below $OUT (a stage that wrote a folder): pack all but gpu_results.json and the
# caller's session.log into out.tgz, so none is lost (call 68, 2026-11-30, lost 13 summaries that way).
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && find . -type f ! -name gpu_results.json ! -name session.log ! -name out.tgz -print0 |
     tar czf out.tgz --null -T - --remove-files && find . -mindepth 1 -type d -empty -delete)
  echo "packed the files of \$OUT into out.tgz (a call returns 8 files)"
fi
exit $overall
