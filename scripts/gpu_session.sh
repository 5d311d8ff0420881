#!/usr/bin/env bash
# A session's CUDA check and benchmarks in device calls of at most 10 minutes: build; the CUDA tests that start no
# MPS daemon in parallel (pytest-xdist, one file per process, -v so a cut run still names each result); the MPS
# tests one at a time; benchmarks/e2e.py (issue 20's graph) and benchmarks/link.py, each with a time budget.
# Everything goes through scripts/gpu_check.sh, so gpu_results.json holds the stages, the test counts and both
# benchmarks. Measured on an H100 (2026-11-25): the parallel tests take ~170 s with 10 processes, the MPS tests
# more than 150 s, so the tests and the benchmarks need one call each:
#
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,tests,mps_tests bash scripts/gpu_session.sh   # .wheels/ carried
#
# .wheels/ holds ../shared/wheels plus pytest-xdist and execnet (`python3 -m pip download --no-deps --only-binary=:all:
# --python-version 3.12 -d .wheels pytest-xdist execnet`); without xdist the parallel stage runs in one process.
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,e2e,link bash scripts/gpu_session.sh          # .wheels/, .pyg/
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/results/gpu_session}"
parallel_tests="tests/sampling/test_sample_neighbors_node_keyed_cuda.py tests/sampling/test_sample_neighbors_cuda.py
  tests/sampling/test_sample_neighbors_cuda_graph.py tests/sampling/test_negative_nodes.py tests/data/test_link_gpu_data_path.py
  tests/gather/test_feature_cache_cuda.py tests/models/test_link_predictor_cuda.py tests/models/test_trim.py
  tests/callbacks/test_step_sync_cuda.py tests/strategies/test_zerocopy_ddp_cuda.py"
mps_tests="tests/pipeline/test_pipeline_cuda.py tests/callbacks/test_pipeline_callback_cuda.py
  tests/callbacks/test_share_auto_cuda.py tests/test_console.py"
export GPU_CHECK_STAGES="${GPU_CHECK_STAGES:-build,tests,mps_tests,e2e,link}"
export GPU_CHECK_TEST_PATHS="$(echo $parallel_tests)" GPU_CHECK_TEST_WORKERS="${GPU_CHECK_TEST_WORKERS:-10}"
export GPU_CHECK_TEST_VERBOSITY=-v
export GPU_CHECK_TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT:-240}"
export GPU_CHECK_EXTRA_STAGE_MPS_TESTS="REQUIRE_CUDA=1 timeout ${GPU_CHECK_MPS_TEST_TIMEOUT:-300} python3 -m pytest -v -rfE -p no:cacheprovider $(echo $mps_tests)"
export GPU_CHECK_E2E_TIMEOUT="${GPU_CHECK_E2E_TIMEOUT:-330}"
export GPU_CHECK_E2E_ARGS="${GPU_CHECK_E2E_ARGS:---preset issue20 --configs model_only,zc_gpu_mps,pyg --steps 300 --warmup 30 --row-budget-s 15 --total-budget-s 300 --cache-dir /tmp/lzc}"
export GPU_CHECK_LINK_TIMEOUT="${GPU_CHECK_LINK_TIMEOUT:-220}"
export GPU_CHECK_LINK_ARGS="${GPU_CHECK_LINK_ARGS:---preset gpu --num-nodes 2000000 --configs model_only,pyg,zc_gpu_mps --pyg-workers 12 --steps 300 --warmup 30 --row-budget-s 12 --cache-dir /tmp/lzc}"
OUT="$OUT" bash scripts/gpu_check.sh
