#!/usr/bin/env bash
# One device call that checks a session's CUDA work and re-measures its benchmarks inside the 10-minute limit:
# build; the CUDA tests that do not start MPS in parallel (pytest-xdist, one file per process); the MPS tests one at
# a time; then benchmarks/e2e.py (issue 20's graph) and benchmarks/link.py, each with a time budget. Everything
# goes through scripts/gpu_check.sh, so gpu_results.json holds the stages, the test counts and both benchmarks.
#
#   GPU_CHECK_COMMIT=<sha> bash scripts/gpu_session.sh     # on the GPU machine, .wheels/ and .pyg/ carried
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
export GPU_CHECK_TEST_PATHS="$(echo $parallel_tests)" GPU_CHECK_TEST_WORKERS="${GPU_CHECK_TEST_WORKERS:-6}"
export GPU_CHECK_TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT:-150}"
export GPU_CHECK_EXTRA_STAGE_MPS_TESTS="REQUIRE_CUDA=1 timeout ${GPU_CHECK_MPS_TEST_TIMEOUT:-150} python3 -m pytest -q -rfE -p no:cacheprovider $(echo $mps_tests)"
export GPU_CHECK_E2E_TIMEOUT="${GPU_CHECK_E2E_TIMEOUT:-140}"
export GPU_CHECK_E2E_ARGS="${GPU_CHECK_E2E_ARGS:---preset issue20 --configs model_only,zc_gpu_mps,pyg --steps 300 --warmup 30 --row-budget-s 10 --total-budget-s 120 --cache-dir /tmp/lzc}"
export GPU_CHECK_LINK_TIMEOUT="${GPU_CHECK_LINK_TIMEOUT:-110}"
export GPU_CHECK_LINK_ARGS="${GPU_CHECK_LINK_ARGS:---preset gpu --num-nodes 2000000 --configs model_only,pyg,zc_gpu_mps --pyg-workers 12 --steps 300 --warmup 30 --row-budget-s 12 --cache-dir /tmp/lzc}"
OUT="$OUT" bash scripts/gpu_check.sh
