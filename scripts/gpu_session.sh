#!/usr/bin/env bash
# A session's CUDA check and benchmarks in device calls of at most 10 minutes: build; the CUDA tests that start no
# MPS daemon in parallel (pytest-xdist, one file per process, -v so a cut run still names each result); the MPS
# tests one at a time; `python3 -m benchmarks.end_to_end` (issue 20's graph) and `python3 -m benchmarks.end_to_end.link`, each with a time budget.
# Everything goes through scripts/gpu_check.sh, so gpu_results.json holds the stages, the test counts and both
# benchmarks. Measured on an H100 (2026-11-25): build ~35 s, the parallel tests ~220 s with 10 processes, the MPS
# tests ~400 s one at a time (the auto-share recipe test alone 91 s, the GPU recipe 46-66 s, the console tests with
# the worker 40-60 s each), so they take a call each, and the benchmarks a third. On an H100 (2026-11-27): build 29 s,
# the parallel stage (every CUDA test file but the MPS ones) 469 tests in ~330 s with 12 processes; the e2e benchmark's
# GPU-rows test (13 rows, a process each) did not end within 200 s alone, so it has a stage of its own (bench_tests):
#
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,tests bash scripts/gpu_session.sh             # .wheels/ carried
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,mps_tests bash scripts/gpu_session.sh
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,mps_tests_b bash scripts/gpu_session.sh
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,bench_tests bash scripts/gpu_session.sh
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,hetero bash scripts/gpu_session.sh           # .wheels/, .pyg/ (~500 s)
#
# .wheels/ holds ../shared/wheels (the GPU image has pytest-xdist and pytest-timeout).
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,e2e,link bash scripts/gpu_session.sh          # .wheels/, .pyg/
# On two GPUs (nvidia-h100-x2 / nvidia-h200-x2; measured on 2 x H200, 2026-11-26: the two-GPU tests ~5 min, the fault
# cases ~1 min each; scaling 1 and 2 GPUs x replicate/clique + PyG ~5 min):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,two_gpus bash scripts/gpu_session.sh           # .wheels/
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,scaling bash scripts/gpu_session.sh            # .wheels/, .pyg/
# Heterogeneous two-GPU scaling in one call (~7 min: the typed cache's clique test, then the mag graph, 1 and 2 GPUs x
# replicate/clique + PyG's hetero NeighborLoader on 2 GPUs, every run within its budget). On 2 x H200 (2026-11-27): build
# ~35 s, the clique test 105 s (both cases), the mag graph 18 s, the 1-GPU run ~60 s; the device time ended there:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,hetero_clique,hetero_scaling bash scripts/gpu_session.sh  # .wheels/, .pyg/
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/results/gpu_session}"
# The parallel stage: every test file with a `cuda` marker except the MPS files below and the two-GPU-only ones, found
# by grep so a new CUDA test file cannot be left out of the session
mps_files="tests/pipeline/test_pipeline_cuda.py tests/callbacks/test_pipeline_callback_cuda.py
  tests/pipeline/test_share_auto_cuda.py tests/test_console.py tests/benchmarks/end_to_end/test_e2e_rows.py
  tests/benchmarks/end_to_end/test_e2e_benchmark.py tests/test_faults_gpu.py tests/pipeline/test_share_numerics_cuda.py
  tests/benchmarks/parts/test_contention.py tests/callbacks/test_telemetry.py tests/pipeline/test_host_waits.py"
# (test_host_waits.py measures a waiting thread's CPU time, which other test processes beside it would disturb: it runs
# in the bimodal stage; test_telemetry.py times idle GPU gaps: beside 11 other test processes on the GPU its GPU-bound case measured a
# stall of 0.31 where alone it is < 0.15 (H200, 2026-11-29), so it runs with the serial files)
parallel_tests="$(grep -rlE 'mark\.cuda' tests --include='test_*.py' | sort | grep -vxF -f <(echo $mps_files | tr ' ' '\n'))"
# The serial files in two stages of a call each: on an H200 (2026-11-29) the first three files' 13 tests took ~430 s,
# and the share rows' test alone more than 200 s (its 4 rows start an MPS worker each)
mps_tests="tests/pipeline/test_pipeline_cuda.py tests/callbacks/test_pipeline_callback_cuda.py
  tests/pipeline/test_share_auto_cuda.py"
mps_tests_b="tests/benchmarks/end_to_end/test_e2e_rows.py::test_share_rows_train_under_mps
  tests/test_console.py tests/pipeline/test_share_numerics_cuda.py tests/benchmarks/parts/test_contention.py
  tests/callbacks/test_telemetry.py"
# stage two_gpus (on nvidia-h100-x2): the two-GPU tests (peer shards over CUDA IPC, clique in the trainer and the
# pipeline worker, auto's measured choice) and why shards are opened for the reading GPU
# (scripts/diagnostics/torch_ipc_peer_read.py); REQUIRE_TWO_GPUS=1 fails a skipped two-GPU test. The fault cases of a
# two-GPU recipe run are stage two_gpu_faults: together they did not fit a call's 10 minutes (2 x H200, 2026-11-29:
# the stage's 490 s ended in the fourth fault case, ~70 s each). Two calls of ~8 min:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,two_gpus bash scripts/gpu_session.sh          # .wheels/
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,two_gpu_faults bash scripts/gpu_session.sh    # .wheels/
two_gpu_tests="tests/graph/test_cuda_ipc.py tests/cache/test_feature_cache_cuda.py tests/strategies/test_strategy_ddp.py
  tests/data/test_ddp.py tests/test_cli_weighted_gcn.py tests/data/test_layerwise_ddp.py"
export GPU_CHECK_EXTRA_STAGE_TWO_GPU_FAULTS="REQUIRE_CUDA=1 REQUIRE_TWO_GPUS=1 timeout ${GPU_CHECK_TWO_GPU_FAULTS_TIMEOUT:-500} python3 -m pytest -v -rfEP -p no:cacheprovider --timeout=120 -m two_gpus tests/data/test_process_group_exit.py tests/test_faults_two_gpus.py"
# stage two_gpu_faults_repeat: the cases not yet steady on 2 GPUs, each run three times (LZC_FAULT_REPEATS), ~7 min
export GPU_CHECK_EXTRA_STAGE_TWO_GPU_FAULTS_REPEAT="REQUIRE_CUDA=1 REQUIRE_TWO_GPUS=1 timeout 120 python3 -m pytest -v -rfEP -p no:cacheprovider --timeout=100 -m two_gpus tests/data/test_process_group_exit.py; LZC_FAULT_REPEATS=${GPU_CHECK_FAULT_REPEATS:-3} REQUIRE_CUDA=1 REQUIRE_TWO_GPUS=1 timeout ${GPU_CHECK_TWO_GPU_FAULTS_TIMEOUT:-500} python3 -m pytest -v -rfEP -p no:cacheprovider --timeout=120 -m two_gpus tests/test_faults_two_gpus.py -k '${GPU_CHECK_FAULT_REPEAT_SELECT:-ctrl_c or kill_worker1}'"
export GPU_CHECK_EXTRA_STAGE_TWO_GPUS="python3 scripts/diagnostics/torch_ipc_peer_read.py; REQUIRE_CUDA=1 REQUIRE_TWO_GPUS=1 timeout ${GPU_CHECK_TWO_GPU_TIMEOUT:-480} python3 -m pytest -v -rfE -p no:cacheprovider --timeout=240 -m 'two_gpus or cuda' $(echo $two_gpu_tests)"
export GPU_CHECK_STAGES="${GPU_CHECK_STAGES:-build,tests,mps_tests,e2e,link}"
export GPU_CHECK_TEST_PATHS="$(echo $parallel_tests)" GPU_CHECK_TEST_WORKERS="${GPU_CHECK_TEST_WORKERS:-10}"
export GPU_CHECK_TEST_VERBOSITY=-v GPU_CHECK_PYTEST_ARGS="${GPU_CHECK_PYTEST_ARGS:--m cuda --timeout=200}"
export GPU_CHECK_TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT:-330}"  # 12 processes on an H200: 623 tests, ~99 % done at 240 s
# --timeout (pytest-timeout, on the GPU image): a test that hangs fails alone and the run still prints its summary
export GPU_CHECK_EXTRA_STAGE_MPS_TESTS="REQUIRE_CUDA=1 timeout ${GPU_CHECK_MPS_TEST_TIMEOUT:-520} python3 -m pytest -v -rfE -p no:cacheprovider --timeout=300 $(echo $mps_tests)"
export GPU_CHECK_EXTRA_STAGE_MPS_TESTS_B="REQUIRE_CUDA=1 timeout ${GPU_CHECK_MPS_TEST_TIMEOUT:-520} python3 -m pytest -v -rfE -p no:cacheprovider --timeout=360 $(echo $mps_tests_b)"
# stage faults_gpu (issue 38, one GPU, < 4 min expected): SIGTERM to a job with the worker under MPS (checkpoint, exit
# 143, every process and the MPS daemon gone within 10 s, then the resume), and the MPS daemon of a command killed by
# SIGABRT / SIGKILL stopped by its supervisor
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,faults_gpu bash scripts/gpu_session.sh                  # .wheels/
# (one case: GPU_CHECK_FAULTS_GPU_SELECT=killed; the confirm stage's two-GPU cases: GPU_CHECK_CONFIRM_FAULTS_SELECT);
# -rP prints what passing cases print: how long each took to end, and which library's handler the trainer has for SIGABRT
export GPU_CHECK_EXTRA_STAGE_FAULTS_GPU="REQUIRE_CUDA=1 timeout ${GPU_CHECK_FAULTS_GPU_TIMEOUT:-420} python3 -m pytest -v -rfEP -p no:cacheprovider --timeout=200 -m cuda tests/test_faults_gpu.py -k '${GPU_CHECK_FAULTS_GPU_SELECT:-sigterm or killed}'"
# stage bench_tests: the e2e benchmark's CUDA tests (every GPU row on the ci graph, one process a row)
export GPU_CHECK_EXTRA_STAGE_BENCH_TESTS="REQUIRE_CUDA=1 timeout ${GPU_CHECK_BENCH_TEST_TIMEOUT:-540} python3 -m pytest -v -rfE -p no:cacheprovider --timeout=520 -m cuda tests/benchmarks/end_to_end/test_e2e_benchmark.py"
# stage pyg_parity (with .pyg/ carried): the link and heterogeneous drop-in tests against PyG's real loaders (torch-sparse)
export GPU_CHECK_EXTRA_STAGE_PYG_PARITY="PYTHONPATH=/tmp/pygsite:\$PYTHONPATH REQUIRE_CUDA=1 timeout 240 python3 -m pytest -v -rfEs -p no:cacheprovider tests/test_link_dropin.py tests/test_hetero_dropin.py"
# stage hetero_prep / hetero: draw and cache the 10x-ogbn-mag graph; heterogeneous rows against PyG's hetero
# NeighborLoader (2- and 3-layer), in GPU_CHECK_HETERO_ARGS' budget. Ours runs before PyG's row, which is timed at two
# worker counts and is the one a fanout's limit cuts (call 73: the 3-layer PyG row took most of 280 s, and ours after
# it was cut); hetero_prep took 58 s on a fresh H200, 12 s warm
export GPU_CHECK_EXTRA_STAGE_HETERO_PREP="timeout ${GPU_CHECK_HETERO_PREP_TIMEOUT:-300} python3 -m benchmarks.end_to_end.hetero --prepare-only --cache-dir /tmp/lzc"
export GPU_CHECK_EXTRA_STAGE_HETERO="for layers in \${GPU_CHECK_HETERO_FANOUTS:-10,10 10,10,10}; do timeout ${GPU_CHECK_HETERO_TIMEOUT:-280} python3 -m benchmarks.end_to_end.hetero --cache-dir /tmp/lzc --pyg-site /tmp/pygsite --num-neighbors \$layers --out /tmp/gpu_check_bench/hetero/layers-\${layers//,/-} ${GPU_CHECK_HETERO_ARGS:---configs model_only,zc_gpu_mps,pyg --row-budget-s 40 --pyg-workers 8,12}; done; tar czf \$OUT/hetero.tgz -C /tmp/gpu_check_bench hetero"
# stage hetero_gemm_rows (issue 40, one GPU, after hetero_prep; ~7 min estimated, not yet run): the typed model runs a
# linear product per node type and layer, each on a row count of its own every batch, so cuBLAS's per-shape host setup
# (~0.1 ms a new shape) may weigh more than in the homogeneous step: mag10x [10,10], zc_gpu_mps and model_only without
# and with GemmRowBuckets(64):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,hetero_prep,hetero_gemm_rows bash scripts/gpu_session.sh   # .wheels/
export GPU_CHECK_EXTRA_STAGE_HETERO_GEMM_ROWS="for rows in 0 64; do timeout 200 python3 -m benchmarks.end_to_end.hetero --cache-dir /tmp/lzc --num-neighbors \${GPU_CHECK_HETERO_GEMM_FANOUTS:-10,10} --configs zc_gpu_mps,model_only --row-budget-s 30 --gemm-rows \$rows --out \$OUT/hetero_gemm_rows-\$rows; done"
# stage hetero_sampling (after hetero_prep): where a typed batch's sampling time goes, per hop (kernels, dedup, a sort
# of as many keys), on the whole GPU, 2 and 3 hops
export GPU_CHECK_EXTRA_STAGE_HETERO_SAMPLING="for layers in 10,10 10,10,10; do timeout 150 python3 -m benchmarks.parts.hetero_sampling --preset ${GPU_CHECK_HETERO_SAMPLING_PRESET:-mag10x} --cache-dir /tmp/lzc --num-neighbors \$layers --out \$OUT/hetero_sampling-\${layers//,/-}.json; done"
# stage typed_sampler (issue 40 item 1, one GPU): the typed sampler's fused calls, pick_neighbors and dedup_typed_keys,
# bitwise the CPU's; then hetero_prep,hetero_sampling time a mag10x batch per hop. Measured on an H200 (2026-11-29):
# the stage 204 tests in 27 s; drawing mag10x ~90 s; a hetero_sampling run ~25 s; an e2e.hetero row ~90 s:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,typed_sampler,hetero_prep,hetero_sampling bash scripts/gpu_session.sh
# Issue 37's speed gate (scripts/diagnostics/speed_gate.sh, .before/ carried; ~8 min for both models, after, before,
# again, model-only): its light rows were 5-6 % below one older run, to repeat with longer windows:
#   SPEED_GATE_ARGS="--preset issue20 --num-nodes 24000000 --avg-degree 12 --features 100 --classes 47 --precision
#   32-true --models light --steps 1500 --warmup 100 --row-budget-s 30" SPEED_GATE_CONFIGS_EXTRA= \
#   bash scripts/diagnostics/speed_gate.sh
export GPU_CHECK_EXTRA_STAGE_TYPED_SAMPLER="REQUIRE_CUDA=1 timeout 300 python3 -m pytest -v -rfE -p no:cacheprovider --timeout=200 -m cuda tests/sampling/test_pick_neighbors.py tests/sampling/test_typed_dedup.py tests/sampling/test_hetero_fused.py tests/data/test_hetero_datamodule.py tests/data/test_hetero_link_gpu_data_path.py tests/sampling/test_sample_neighbors_cuda.py"
# stage share_check (issue 40, one GPU, ~7 min): the heavy 24M-node rows trained at chance with the worker's MPS share
# at 20 % (one H200, 2026-11-29, commit b96e94e: train loss stuck at ln 47, val acc 0.02-0.03, in fp32 and bf16 host
# tables; the same rows at 10 % reached 0.968, and at 20 % on an H100 of an older tree 0.963). Where it breaks: every
# 10th batch checked against the dataset when its step starts AND ends (a slot rewritten during its step shows at the
# end), at 20 % / 10 % / in-process (a suspect fixed on the CPU after that call: the producer freed each sample before
# its stream synchronized, so the next sample on the lookahead stream could reuse its memory mid-gather, a race that a
# larger worker share makes likelier; tests/pipeline/test_producer.py); then model-only with this process under an MPS daemon at 80 % (the trainer's share
# at 20 %) and no worker, which separates the data path from the trainer's compute under a share:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,share_check bash scripts/gpu_session.sh                # .wheels/
# the e2e benchmark's 24M-node graph (issue 20's size), cached in /tmp/lzc on a warm machine
e2e_graph="--preset issue20 --num-nodes 24000000 --avg-degree 12 --features 100 --classes 47 --cache-dir /tmp/lzc"
share_args="$e2e_graph --precision bf16-mixed --models heavy --steps 300 --warmup 60 --val-every 50 --row-budget-s 12 --check-every 10"
export GPU_CHECK_EXTRA_STAGE_SHARE_CHECK="REQUIRE_CUDA=1 timeout 90 python3 -m pytest -v -rfE -p no:cacheprovider -m cuda tests/pipeline/test_producer_cuda.py; timeout 330 python3 -m benchmarks.end_to_end $share_args --configs zc_gpu_mps_20,zc_gpu_mps,zc_gpu_inproc --out \$OUT/share_check; timeout 150 python3 -m lightning_zerocopy.pipeline.mps_launcher --worker-sm-percent 20 -- python3 -m benchmarks.end_to_end $share_args --configs model_only --out \$OUT/share_check_model_only_80; rm -rf \$OUT/share_check*/logs/*/hparams.yaml \$OUT/share_check*/*.png"
# stage share_numerics (one GPU, ~4 min): the share check found by share_check's model-only row (the heavy model at
# chance with the trainer an MPS client at 80 % and no worker: cuBLAS's bf16/fp16 GEMMs wrong at some SM counts,
# scripts/diagnostics/mps_share_gemm.py). The CUDA tests, the probe command at five trainer shares for bf16 and fp16,
# then the 1M-node graph's heavy rows at a 20 % worker share (must stop with the check's error) and at 10 % (trains):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,share_numerics bash scripts/gpu_session.sh              # .wheels/
export GPU_CHECK_EXTRA_STAGE_SHARE_NUMERICS="REQUIRE_CUDA=1 timeout 200 python3 -m pytest -v -rfE -p no:cacheprovider -m cuda tests/pipeline/test_share_numerics_cuda.py; for p in bf16-mixed 16-mixed; do timeout 150 python3 -m lightning_zerocopy.pipeline.share_numerics --trainer-percent 90,80,70,60,50 --precision \$p > \$OUT/share_numerics_\$p.txt 2>&1; done; timeout 240 python3 -m benchmarks.end_to_end --preset small --models heavy --precision bf16-mixed --cache-dir /tmp/lzc --steps 300 --warmup 30 --val-every 50 --row-budget-s 10 --configs zc_gpu_mps_20,zc_gpu_mps --out \$OUT/share_rows; rm -rf \$OUT/share_rows/logs/*/hparams.yaml \$OUT/share_rows/*.png"
# stage contention (issue 40 item 3, one GPU): the heavy step beside each load at the worker's 10 % share
# (benchmarks/parts/contention.py), then its CUDA test. Ran on an H200 (2026-11-29, dbe46e6, 196 s with the loads
# none,sm,hbm,pcie,dma: the SM-issued PCIe reads slowed the step x1.262 at 40 GB/s, the copy engines x1.028 at 54.5).
# The default loads now ask why, and at the worker's real rates: the same bytes over few pages (pcie_seq: address
# translation or the reads?), held to 10 and 20 GB/s, and the copy engines' gather (staged: host threads + one copy);
# ~8 loads x ~25 s + the test ~70 s:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,contention bash scripts/gpu_session.sh                  # .wheels/
export GPU_CHECK_EXTRA_STAGE_CONTENTION="timeout 330 python3 -m benchmarks.parts.contention --loads ${GPU_CHECK_CONTENTION_LOADS:-none,pcie,pcie@20,pcie@10,pcie_seq,staged,staged@10,dma@20} --worker-percent 10 --steps 200 --out \$OUT/contention.json; REQUIRE_CUDA=1 timeout 120 python3 -m pytest -v -rfE -p no:cacheprovider -m cuda tests/benchmarks/parts/test_contention.py"
# stage sample_contention (issue 40 item 1, one GPU): does sampling beside training take 10-20x its whole-GPU time
# because of the worker's 10 % share or because its kernels wait behind the trainer's? The GPU sampler (heavy batches)
# and the zero-copy gather as loads, each timed alone at 10 %, alone on the whole GPU and beside the heavy step
# (benchmarks.parts.contention --alone-s), then the contention CUDA tests. On one H200 (2026-11-30, fd865e2) the
# benchmark took ~120 s and the tests ~140 s: sampling 0.30 ms a batch on the whole GPU, 0.63 alone at 10 %, 0.65 beside
# the step (no queueing behind the trainer); docs/gpu_checks/h200-2026-11-30. Since then the default loads add
# sample_gather: the sampler while the same client gathers without pause, as in the worker (not yet run):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,cpu_speed,sample_contention bash scripts/gpu_session.sh     # .wheels/
export GPU_CHECK_EXTRA_STAGE_SAMPLE_CONTENTION="timeout 300 python3 -m benchmarks.parts.contention --loads ${GPU_CHECK_SAMPLE_CONTENTION_LOADS:-none,sample,sample_gather,pcie} --alone-s 6 --worker-percent 10 --steps 300 --out \$OUT/sample_contention.json; REQUIRE_CUDA=1 timeout 250 python3 -m pytest -v -rfE -p no:cacheprovider -m cuda tests/benchmarks/parts/test_contention.py"
# stage staged (issue 40 items 2-3, one GPU, ~7 min estimated; not yet run): gather_mode 'staged' (host threads + the
# copy engines, no zero-copy reads beside training): its CUDA tests (the table; the builder's side-stream and hot-row
# batches; the Strategy's segmented cache, bitwise and counted), then the 24M-node e2e rows zc_gpu_mps against zc_gpu_mps_staged in one run, light and heavy, bf16
# host table and bf16-mixed (the fastest settings; contention measured x1.26 for zero-copy reads, x1.06 staged):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,staged bash scripts/gpu_session.sh                     # .wheels/
export GPU_CHECK_EXTRA_STAGE_STAGED="REQUIRE_CUDA=1 timeout 150 python3 -m pytest -v -rfE -p no:cacheprovider -m cuda tests/gather/test_gather_cuda.py tests/data/test_gpu_data_path.py tests/cache/test_feature_cache_cuda.py -k 'staged or hot_rows or side_stream or read_orders'; timeout -s TERM ${GPU_CHECK_STAGED_TIMEOUT:-330} python3 -m benchmarks.end_to_end --preset issue20 --num-nodes 24000000 --avg-degree 12 --features 100 --classes 47 --precision bf16-mixed --feature-dtype bfloat16 --steps 500 --warmup 80 --row-budget-s 15 --configs zc_gpu_mps,zc_gpu_mps_staged,model_only --cache-dir /tmp/lzc --out \$OUT/staged_rows; rm -rf \$OUT/staged_rows/logs/*/hparams.yaml \$OUT/staged_rows/*.png"
# stage x_dtype (issue 40, one GPU, ~9 min: on an H200 (2026-11-29) a row took ~60 s and the graph 21 s, so 200 s a
# dtype cut model-only each time; 270 s since): the heavy 24M-node rows zc_gpu_mps,
# zc_gpu_mps_staged (its host threads capped at half the CPUs since 1280378) and model_only, bf16 host table and
# bf16-mixed, twice in one call: batch.x cast to float32 (as every earlier row) and handed over in bfloat16
# (--x-dtype: no cast in the worker's assemble, half the slot bytes; model-only's batches alike):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,x_dtype bash scripts/gpu_session.sh                   # .wheels/
export GPU_CHECK_EXTRA_STAGE_X_DTYPE="for x in float32 bfloat16; do timeout -s TERM 270 python3 -m benchmarks.end_to_end --preset issue20 --num-nodes 24000000 --avg-degree 12 --features 100 --classes 47 --precision bf16-mixed --feature-dtype bfloat16 --x-dtype \$x --models heavy --steps 500 --warmup 80 --row-budget-s 12 --configs zc_gpu_mps,zc_gpu_mps_staged,model_only --cache-dir /tmp/lzc --out \$OUT/x_\$x; rm -rf \$OUT/x_\$x/logs/*/hparams.yaml \$OUT/x_\$x/*.png; done"
# stage light_mps (issue 40, one GPU, ~8 min estimated, not yet run): the light model's step grew from 3.62 to 5.43 ms
# beside the worker (H200, 2026-11-30, fd865e2: 0.66x model-only) while its build fit in the step. Two blocks of
# model_only, model_only_mps (the trainer an MPS client at 90 %, no worker) and zc_gpu_mps, light, 24M nodes, bf16:
# model_only_mps against model_only is the client's own cost, zc_gpu_mps against model_only_mps the worker's; each
# run records its host CPUs' speed (the conditions line), then the e2e MPS rows' CUDA test:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,light_mps bash scripts/gpu_session.sh                 # .wheels/
export GPU_CHECK_EXTRA_STAGE_LIGHT_MPS="timeout -s TERM 330 python3 -m benchmarks.end_to_end $e2e_graph --precision bf16-mixed --feature-dtype bfloat16 --models ${GPU_CHECK_LIGHT_MPS_MODELS:-light} --steps 1500 --warmup 100 --row-budget-s 15 --total-budget-s 300 --row-timeout-s 100 --repeats 2 --configs model_only,model_only_mps,zc_gpu_mps --out \$OUT/light_mps; rm -rf \$OUT/light_mps/logs/*/hparams.yaml \$OUT/light_mps/*.png; REQUIRE_CUDA=1 timeout 240 python3 -m pytest -v -rfE -p no:cacheprovider -m cuda tests/benchmarks/end_to_end/test_e2e_rows.py"
# stage worker_profile (issue 40, one GPU, after hetero_prep; 277 s with build and hetero_prep, call 60 on an H200,
# 2026-11-30): neither the host waits (call 58) nor a high-priority sampling stream or 512 gather blocks a
# multiprocessor (call 59, those knobs since removed) explain the worker's 5-ms heavy sample stage. torch.profiler over 40 of the worker's batches
# (LIGHTNING_ZEROCOPY_WORKER_PROFILE) in the heavy and the typed zc_gpu_mps rows; the summary gives each stream's
# kernels and how long each waited on the GPU after its launch call, and each thread's CUDA calls:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,hetero_prep,worker_profile bash scripts/gpu_session.sh   # .wheels/
export GPU_CHECK_EXTRA_STAGE_WORKER_PROFILE="for m in heavy typed; do d=\$OUT/prof_\$m; if [ \$m = heavy ]; then LIGHTNING_ZEROCOPY_WORKER_PROFILE=\$d:300:40 timeout -s TERM 150 python3 -m benchmarks.end_to_end $e2e_graph --precision bf16-mixed --feature-dtype bfloat16 --models heavy --steps 1000 --warmup 100 --row-budget-s 10 --row-timeout-s 120 --repeats 1 --configs zc_gpu_mps --out \$d/run; else LIGHTNING_ZEROCOPY_WORKER_PROFILE=\$d:150:30 timeout -s TERM 120 python3 -m benchmarks.end_to_end.hetero --cache-dir /tmp/lzc --num-neighbors ${GPU_CHECK_HETERO_MPS_FANOUTS:-10,10,10} --configs zc_gpu_mps --feature-dtype bfloat16 --row-budget-s 20 --row-timeout-s 100 --out \$d/run; fi; for t in \$d/worker_trace_*.json; do python3 scripts/diagnostics/worker_trace_summary.py \$t --top 10 > \$d/summary_\$(basename \$t .json).txt 2>&1; gzip -f \$t; done; cat \$d/summary_*.txt; done"
# (stages cast, heavy_cache, light_cast and typed_cast ran in calls 61 and 64-67, 2026-11-30,
# docs/gpu_checks/h200-2026-11-30c and -30d: the trainer-side cast did not hold up, and heavy with the whole bf16 table
# cached on the GPU was still 0.72x model-only, its step p50 7.34 ms against 5.19 alone)
# stage heavy_step (issue 40, one GPU, 387 s in call 68, 2026-11-30, docs/gpu_checks/h200-2026-11-30e): what lengthens
# the heavy step beside the worker once no row crosses PCIe. Call 68: the trainer's kernels 3.45 ms a step alone, 3.76
# as an MPS client, 4.05 beside the worker; every row ran at ~60 steps/s, the profiles' files then written inside the
# timed steps (the trainer's now after training, the worker's still when its window ends). Heavy, one block: model_only,
# model_only_mps (the trainer an MPS client, no worker), zerocopy_ddp_mps (the whole table cached), zc_gpu_mps and
# zc_gpu_mps_depth3 (three slots), every row's trainer profiled over steps 300-339 (LIGHTNING_ZEROCOPY_TRAINER_PROFILE)
# and its worker over the same window (in a folder of the row's name); each trainer trace compared kernel by kernel with
# model_only's (worker_trace_summary.py --against; the profiled steps slow each row a little, so take rates from
# unprofiled runs); only the summaries come back (gpu_check.sh packs them into out.tgz):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,heavy_step bash scripts/gpu_session.sh                # .wheels/
export GPU_CHECK_EXTRA_STAGE_HEAVY_STEP="d=\$OUT/heavy_step; LIGHTNING_ZEROCOPY_TRAINER_PROFILE=\$d/prof:300:40 LIGHTNING_ZEROCOPY_WORKER_PROFILE=\$d/prof:300:40 timeout -s TERM 440 python3 -m benchmarks.end_to_end $e2e_graph --precision bf16-mixed --feature-dtype bfloat16 --models heavy --steps 1500 --warmup 100 --row-budget-s 12 --total-budget-s 420 --row-timeout-s 100 --repeats 1 --cache-budget 20% --configs model_only,model_only_mps,zerocopy_ddp_mps,zc_gpu_mps,zc_gpu_mps_depth3 --out \$d; base=\$(ls \$d/prof/trainer_model_only-heavy_trace_*.json | head -1); for t in \$d/prof/*_trace_*.json \$d/prof/*/*_trace_*.json; do [ -f \$t ] || continue; n=\$(echo \${t#\$d/prof/} | tr / _); n=\${n%.json}; python3 scripts/diagnostics/worker_trace_summary.py \$t --top 12 > \$d/summary_\$n.txt 2>&1; case \$n in trainer_*) [ -n \"\$base\" ] && python3 scripts/diagnostics/worker_trace_summary.py \$t --against \$base --top 15 > \$d/against_model_only_\$n.txt 2>&1;; esac; done; rm -rf \$d/prof \$d/logs/*/hparams.yaml \$d/*.png; cat \$d/against_model_only_*.txt | head -150"
# stage mag_deep (issue 40's last table, one GPU, after hetero_prep; 261 s in call 75 on an H200; its model_only row
# needs more than 110 s, call 71 cut it there): the user's shape on
# mag10x, 3 layers [15,10,5], hidden 256, model_only and zc_gpu_mps (bf16 paper features) in one run, so the ratio is
# a same-run one (the earlier 0.94x took its model-only row from another machine start):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,hetero_prep,mag_deep bash scripts/gpu_session.sh      # .wheels/
export GPU_CHECK_EXTRA_STAGE_MAG_DEEP="timeout -s TERM 360 python3 -m benchmarks.end_to_end.hetero --cache-dir /tmp/lzc --num-neighbors 15,10,5 --hidden 256 --configs model_only,zc_gpu_mps --feature-dtype bfloat16 --row-budget-s 40 --row-timeout-s 170 --out \$OUT/mag_deep; rm -rf \$OUT/mag_deep/logs/*/hparams.yaml \$OUT/mag_deep/*.png; cat \$OUT/mag_deep/report.md"
# stage gemm_choice (issue 40, one GPU, 131 s in call 76 on an H200: no setting recovers the kernel at 90 %): call 68
# found the heavy trainer, an MPS client at 90 %, running one weight-gradient GEMM with a kernel twice as slow as on the
# whole GPU (0.18 ms a step). The heavy step alone (scripts/diagnostics/mps_share_step_gemms.py: its time, its GEMM
# kernels) under each BLAS setting, on the whole GPU, as a client at 90 % and as an unlimited client (trainer 100 %);
# one JSON line each:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,gemm_choice bash scripts/gpu_session.sh                 # .wheels/
export GPU_CHECK_EXTRA_STAGE_GEMM_CHOICE="g=scripts/diagnostics/mps_share_step_gemms.py; for b in default cublas cublaslt tunableop; do timeout 90 python3 \$g --blas \$b --tag whole; timeout 120 python3 -m lightning_zerocopy.pipeline.mps_launcher --worker-sm-percent 10 -- python3 \$g --blas \$b --tag share90; done > \$OUT/gemm_choice.jsonl 2> \$OUT/gemm_choice.err; timeout 120 python3 -m lightning_zerocopy.pipeline.mps_launcher --worker-sm-percent 10 --trainer-sm-percent 100 -- python3 \$g --tag share100 >> \$OUT/gemm_choice.jsonl 2>> \$OUT/gemm_choice.err; cat \$OUT/gemm_choice.jsonl; tail -5 \$OUT/gemm_choice.err"
# stage light_depth (issue 40, one GPU, ~5.5 min estimated, not yet run; its rows need their 90-s limit: call 78 gave
# them 45 s and the first MPS row was cut in its setup): the light row at 0.92x model-only waits 0.68 ms a step for its
# batch against model-only's 0.38, though a batch is built in less than a step (2026-11-30, fifth session): with two
# slots the one freed after step t must be refilled while the host issues step t+1. Light in two blocks: model_only,
# zc_gpu_mps, zc_gpu_mps_depth3 (three slots):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,light_depth bash scripts/gpu_session.sh               # .wheels/
export GPU_CHECK_EXTRA_STAGE_LIGHT_DEPTH="timeout -s TERM 340 python3 -m benchmarks.end_to_end $e2e_graph --precision bf16-mixed --feature-dtype bfloat16 --models light --steps 1500 --warmup 100 --row-budget-s 12 --total-budget-s 310 --row-timeout-s 90 --repeats 2 --configs model_only,zc_gpu_mps,zc_gpu_mps_depth3 --out \$OUT/light_depth; rm -rf \$OUT/light_depth/logs/*/hparams.yaml \$OUT/light_depth/*.png"
# stage hetero_levers (issue 40, one GPU, after hetero_prep; ~5 min estimated, not yet run): the two levers on the
# typed worker's 510 MB of zero-copy reads a batch, both with the paper features held as bf16: zc_gpu_mps and
# zerocopy_ddp_mps (ZeroCopyDDPStrategy on one GPU caching the hot rows of each featured type, --cache-budget 20 %):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,hetero_prep,hetero_levers bash scripts/gpu_session.sh   # .wheels/
export GPU_CHECK_EXTRA_STAGE_HETERO_LEVERS="timeout -s TERM 280 python3 -m benchmarks.end_to_end.hetero --cache-dir /tmp/lzc --num-neighbors ${GPU_CHECK_HETERO_MPS_FANOUTS:-10,10,10} --configs zc_gpu_mps,zerocopy_ddp_mps --feature-dtype bfloat16 --cache-budget ${GPU_CHECK_HETERO_CACHE_BUDGET:-20%} --row-budget-s 30 --row-timeout-s 130 --out \$OUT/hetero_levers"
# stage hetero_mps (issue 40, one GPU, after hetero_prep; ~8 min estimated, not yet run): the typed 3-layer step grew
# from 37.34 to 41.15 ms at p50 beside the worker (mag10x [10,10,10], H200 2026-11-30: 0.906x model-only, no stall).
# model_only, model_only_mps (the trainer an MPS client at 90 %, no worker) and zc_gpu_mps in one invocation, then
# zc_gpu_mps with the paper features held as bf16 (--feature-dtype: the worker's gather read 510 MB a batch at 42 GB/s
# in fp32, beside its own sampler):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,hetero_prep,hetero_mps bash scripts/gpu_session.sh   # .wheels/
export GPU_CHECK_EXTRA_STAGE_HETERO_MPS="timeout -s TERM 360 python3 -m benchmarks.end_to_end.hetero --cache-dir /tmp/lzc --num-neighbors ${GPU_CHECK_HETERO_MPS_FANOUTS:-10,10,10} --configs model_only,model_only_mps,zc_gpu_mps --row-budget-s 30 --row-timeout-s 110 --out \$OUT/hetero_mps; timeout -s TERM 130 python3 -m benchmarks.end_to_end.hetero --cache-dir /tmp/lzc --num-neighbors ${GPU_CHECK_HETERO_MPS_FANOUTS:-10,10,10} --configs zc_gpu_mps --feature-dtype bfloat16 --row-budget-s 30 --row-timeout-s 110 --out \$OUT/hetero_bf16"
# stage bimodal (issue 40, one GPU, ~7 min with the build): the heavy zero-copy row ran at 0.91x and 0.70x of
# model-only in one call (H200, 2026-11-29, 0b4d078): the same data path, a step p50 of 5.81 against 8.34 ms. Two
# blocks of zc_gpu_mps (the pipeline's host threads sleep while they wait for the GPU, since that session: blocking
# events, cudaDeviceScheduleBlockingSync in the worker), zc_gpu_mps_spin (they spin on a core, CUDA's default and the
# code before: up to three cores busy beside the trainer's launch thread) and model_only (~62 + 62 + 45 s a block, the graph ~22 s), each run with the GPU's clocks, power and
# clock-holding reasons over its steady window (benchmarks/common/gpu_clocks.py, sampled by the orchestrator) and the
# CPUs of the trainer, its worker and the machine (SteadyHostLoad): the report's "Conditions" section says whether a
# slow run ran at lower clocks, on a shared core, or neither; then the host-wait CUDA test:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,bimodal bash scripts/gpu_session.sh                   # .wheels/
export GPU_CHECK_EXTRA_STAGE_BIMODAL="timeout -s TERM 400 python3 -m benchmarks.end_to_end --preset issue20 --num-nodes 24000000 --avg-degree 12 --features 100 --classes 47 --precision bf16-mixed --feature-dtype bfloat16 --x-dtype bfloat16 --models heavy --steps 800 --warmup 80 --row-budget-s 15 --total-budget-s 360 --row-timeout-s 120 --repeats 2 --configs zc_gpu_mps,zc_gpu_mps_spin,model_only --cache-dir /tmp/lzc --out \$OUT/bimodal; rm -rf \$OUT/bimodal/logs/*/hparams.yaml \$OUT/bimodal/*.png; REQUIRE_CUDA=1 timeout 60 python3 -m pytest -v -rfE -p no:cacheprovider -m cuda tests/pipeline/test_host_waits.py"
# stage hetero_clique (two GPUs): the typed cache's clique on two ranks, every batch against the uncached CPU one
export GPU_CHECK_EXTRA_STAGE_HETERO_CLIQUE="REQUIRE_CUDA=1 REQUIRE_TWO_GPUS=1 timeout ${GPU_CHECK_HETERO_CLIQUE_TIMEOUT:-120} python3 -m pytest -v -rfE -p no:cacheprovider --timeout=110 -m two_gpus tests/data/test_ddp.py"
# stage hetero_scaling (two GPUs, .pyg/ carried): benchmarks.scaling --graph hetero on the mag preset (drawn first, ~1
# min); 1 GPU, 2 GPUs replicate and clique (pipeline worker under MPS, as the homogeneous stage), PyG's hetero
# NeighborLoader under DDP on 2 GPUs; each run 30 warm-up steps, then --run-budget-s of steps, killed at --timeout;
# the report (seeds/s, steps/s a rank, speed-up over 1 GPU, hit rates per type) in $OUT/hetero_scaling.json and .log
export GPU_CHECK_EXTRA_STAGE_HETERO_SCALING="timeout ${GPU_CHECK_HETERO_SCALING_TIMEOUT:-420} python3 -m benchmarks.scaling --graph hetero --cache-dir /tmp/lzc --out \$OUT/hetero_scaling.json ${GPU_CHECK_HETERO_SCALING_ARGS:---preset mag --gpus 1,2 --policies replicate,clique --budgets 0.1 --pipelines worker --epochs 2 --warmup-batches 30 --limit-batches 400 --run-budget-s 12 --presample-batches 16 --timeout 90 --prepare-timeout 150 --pyg-gpus 2 --pyg-workers 8 --pyg-site /tmp/pygsite}"
# stage scaling_diag (two GPUs; .wheels/ carried, .pyg/ not needed): where a DDP rank's step time goes when the second
# GPU joins (issue 39), `python3 -m benchmarks.scaling.diag` on a 4M-node graph (drawn on the GPU and cached first; the
# scaling stage's 8M graph takes longer to prepare and to load in every run). Each run: 25 warm-up steps, then a
# data-path epoch and a model-only epoch (a ring of 16 real batches staged on each GPU) of ~2.5 s each, with per-step
# CUDA-event timelines, threads/CPU use and NCCL's transports per rank. In priority order: heavy on 1/2 GPUs with the
# worker under MPS (its model-only epoch: WITH an MPS daemon) and with no worker and no MPS (model-only WITHOUT); two
# independent 1-GPU runs at once (no DDP); the knob variants on 2 GPUs (static_graph=0+gradient_as_bucket_view=0, i.e.
# torch's DDP defaults, torch_threads=4, NCCL_MAX/MIN_CTAS 2/1, worker share 20 %); light on 1/2 GPUs with the worker,
# then without. A run starts only with >= 40 s of --deadline-s 430 left (the rest is reported as skipped; runs took
# 25-53 s on 2 x H200 (2026-11-28), and since the measured epochs are paced right they last ~4 s more, so the last
# ones are skipped); $OUT/scaling_diag.json is rewritten after every run, the table is at the end of
# $OUT/scaling_diag.log. Expected: build ~35 s + this stage <= 440 s, about 8 min in all:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,scaling_diag bash scripts/gpu_session.sh     # .wheels/ carried
# (light before the knobs: GPU_CHECK_SCALING_DIAG_ARGS="<the defaults below> --plan heavy-worker,heavy-off,light-worker,pair,knobs")
export GPU_CHECK_EXTRA_STAGE_SCALING_DIAG="timeout -s TERM ${GPU_CHECK_SCALING_DIAG_TIMEOUT:-465} python3 -m benchmarks.scaling.diag --cache-dir /tmp/lzc --out \$OUT/scaling_diag.json ${GPU_CHECK_SCALING_DIAG_ARGS:---num-nodes 4000000 --gpus 1,2 --deadline-s 430 --timeout 90 --min-run-s 40 --phase-s 2.5 --warmup-batches 25 --ring-batches 16 --budget 0.1 --presample-batches 16}"
# stage scaling_confirm (two GPUs; .wheels/ carried): issue 39's confirming call, in priority order. (1) `python3 -m
# benchmarks.scaling.confirm`, drift-robust: the 4M-node graph (17 s), a discarded warm-up run (two independent 1-GPU
# fits), then 2 blocks of heavy runs 1gpu / 2gpu-torch (torch's DDP defaults, as before issue 39) / 2gpu
# (ZeroCopyDDPStrategy's defaults: static_graph auto + gradient_as_bucket_view), the second block in reverse order,
# every run with the worker under MPS, a data-path epoch and a model-only epoch of ~2 s each; ratios inside each block,
# medians over the blocks, the aims (heavy >= 1.9x, >= 0.95 a rank) in the table at the end of $OUT/scaling_confirm.log;
# light blocks only if time is left (expected not). Runs on 2 x H200 in the diag call: 1 GPU 31-36 s, 2 GPUs 43-53 s,
# the pair 43 s; + ~2.5 s each for the longer epochs: 17 + 46 + 2 x (34 + 49 + 49) ~ 327 s of --deadline-s 335 (a
# block starts only with time for two of its runs). (2) The two-GPU fault cases with the worker under MPS
# (tests/test_faults_two_gpus.py): SIGKILL of rank 1's worker mid-epoch and Ctrl-C of the command (the two cases not
# yet passed on 2 GPUs since the clique readers' fix, 2026-11-29; every case: stage two_gpu_faults); every process ends
# within 10 s, one line names the cause, nothing in /dev/shm, no MPS process left; ~55-70 s each (the graph drawn once),
# at most 190 s. SIGTERM expects issue 38's exit 143 (faults38 merged; before it Lightning's handler broadcasts inside
# the signal handler, which hung under static_graph on CPU ranks). Expected: build ~25 s + ~330 s + ~165 s ~ 8.7 min,
# at most 25 + 345 + 190 = 560 s:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,scaling_confirm bash scripts/gpu_session.sh     # .wheels/ carried
# Measured on 2 x H200 (2026-11-28, docs/scaling/h200x2-confirm-2026-11-28): the warm-up 52 s, 1 GPU 37 s, 2 GPUs
# 51-55 s: the heavy blocks alone took the deadline (324 s). The light model in a call of its own:
#   GPU_CHECK_SCALING_CONFIRM_ARGS='--num-nodes 4000000 --configs 1gpu,2gpu --models light --repeats 2 --warmup-run 2x1
#   --deadline-s 335 --timeout 90 --min-run-s 34 --phase-s 2 --warmup-batches 25 --ring-batches 16 --budget 0.1
#   --presample-batches 16' GPU_CHECK_STAGES=build,scaling_confirm bash scripts/gpu_session.sh
export GPU_CHECK_EXTRA_STAGE_SCALING_CONFIRM="timeout -s TERM ${GPU_CHECK_SCALING_CONFIRM_TIMEOUT:-345} python3 -m benchmarks.scaling.confirm --cache-dir /tmp/lzc --out \$OUT/scaling_confirm.json ${GPU_CHECK_SCALING_CONFIRM_ARGS:---num-nodes 4000000 --configs 1gpu,2gpu-torch,2gpu --models heavy,light --repeats 2 --warmup-run 2x1 --deadline-s 335 --timeout 90 --min-run-s 34 --phase-s 2 --warmup-batches 25 --ring-batches 16 --budget 0.1 --presample-batches 16}; REQUIRE_CUDA=1 REQUIRE_TWO_GPUS=1 timeout ${GPU_CHECK_CONFIRM_FAULTS_TIMEOUT:-190} python3 -m pytest -v -rfEP -p no:cacheprovider --timeout=90 -m two_gpus tests/test_faults_two_gpus.py -k '${GPU_CHECK_CONFIRM_FAULTS_SELECT:-kill_worker1 or ctrl_c}'"
# Where the data-phase forward waits for the GPU (issue 39): the diagnostic's knob run on 2 GPUs with the CUDA sync
# debug mode on for 20 data-phase steps of each rank (benchmarks/scaling/sync_finder.py; each rank's report gains
# `syncs`, per caller), then the same run with Lightning's per-step SIGTERM broadcast skipped (found on the CPU,
# 2026-11-29: under several ranks every step starts with a device tensor, a broadcast and `.item()`, a host-device
# sync a step that one rank never makes; the command skips it, and since 2026-11-30 so do benchmarks.scaling's runs of
# ours unless `--knobs step_sigterm_broadcast=1`: the default args below now A/B keeping it); ~4.5 min:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,scaling_syncs bash scripts/gpu_session.sh       # .wheels/ carried
# (since 2026-11-29 every rank's worker waits for the GPU asleep, pipeline/host_waits.py; the spinning waits from
# before, for an A/B on 2 GPUs: add the knob variant env.LIGHTNING_ZEROCOPY_SPIN_WAITS=1 to --knobs, e.g.
# GPU_CHECK_SCALING_SYNCS_ARGS="<the defaults below, with> --knobs step_sigterm_broadcast=1,env.LIGHTNING_ZEROCOPY_SPIN_WAITS=1")
export GPU_CHECK_EXTRA_STAGE_SCALING_SYNCS="timeout -s TERM ${GPU_CHECK_SCALING_SYNCS_TIMEOUT:-290} python3 -m benchmarks.scaling.diag --cache-dir /tmp/lzc --out \$OUT/scaling_syncs.json ${GPU_CHECK_SCALING_SYNCS_ARGS:---num-nodes 4000000 --gpus 1,2 --plan knobs --knobs sync_debug_steps=20,step_sigterm_broadcast=1 --deadline-s 280 --timeout 90 --min-run-s 40 --phase-s 2 --warmup-batches 25 --ring-batches 16 --budget 0.1 --presample-batches 16}"
# stage scaling_profile (issue 39/40; .wheels/ carried): the sync debug mode found no synchronizing call in the
# data-phase forward (0.05 a step; 2 x H200, call 28), yet the trainer's main thread waited ~1.8 ms a step more than in
# the model phase. PyTorch's profiler over 20 steps of each phase on every rank sums the main thread's host time by
# operator and CUDA runtime call (benchmarks/scaling/host_profile.py; the entries at the end of the log, in
# $OUT/scaling_profile.json per rank as host_profile), beside the sleeping waits' spinning A/B. ~4 min on 2 GPUs; on
# one GPU (GPU_CHECK_SCALING_PROFILE_GPUS=1) the same on the 1-GPU run:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,scaling_profile bash scripts/gpu_session.sh     # .wheels/ carried
export GPU_CHECK_EXTRA_STAGE_SCALING_PROFILE="timeout -s TERM ${GPU_CHECK_SCALING_PROFILE_TIMEOUT:-250} python3 -m benchmarks.scaling.diag --cache-dir /tmp/lzc --out \$OUT/scaling_profile.json --num-nodes 4000000 --gpus ${GPU_CHECK_SCALING_PROFILE_GPUS:-1,2} --plan knobs --knobs profile_steps=20,profile_steps=20+env.LIGHTNING_ZEROCOPY_SPIN_WAITS=1 --deadline-s 240 --timeout 90 --min-run-s 40 --phase-s 2 --warmup-batches 25 --ring-batches 16 --budget 0.1 --presample-batches 16"
# stage scaling_table (issue 39, two GPUs, .pyg/ carried): the README's 1/2-GPU table, one model a call
# (GPU_CHECK_SCALING_MODEL=heavy | light): 1 GPU, 2 GPUs x replicate/clique/auto, PyG's NeighborLoader under DDP on 2
# GPUs; the worker under MPS on every rank and row-count buckets (--gemm-rows 64), as recipes/multi_gpu.yaml. On 2 x
# H200 (2026-11-30): the stage 358 s (heavy) and 289 s (light), build 25 s. One run a row moves with the VM's CPU
# draw (stage cpu_speed): GPU_CHECK_SCALING_REPEATS=2 --policies replicate,clique (GPU_CHECK_SCALING_POLICIES) runs two
# blocks of alternating order and prints the medians, ~1.6x the time without auto
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,scaling_table bash scripts/gpu_session.sh              # .wheels/, .pyg/
export GPU_CHECK_EXTRA_STAGE_SCALING_TABLE="timeout -s TERM ${GPU_CHECK_SCALING_TABLE_TIMEOUT:-500} python3 -m benchmarks.scaling --model ${GPU_CHECK_SCALING_MODEL:-heavy} --gpus 1,2 --policies ${GPU_CHECK_SCALING_POLICIES:-replicate,clique,auto} --repeats ${GPU_CHECK_SCALING_REPEATS:-1} --budgets 0.1 --pipelines worker --num-nodes 8000000 --epochs 2 --warmup-batches 30 --limit-batches 300 --run-budget-s 14 --presample-batches 16 --gemm-rows 64 --timeout 110 --pyg-gpus 2 --pyg-workers 8 --pyg-site /tmp/pygsite --cache-dir /tmp/lzc --out \$OUT/scaling_table-${GPU_CHECK_SCALING_MODEL:-heavy}.json"
# stage e2e_gemm_rows (issue 40, one GPU): GemmRowBuckets(64) raised the heavy model's 2-GPU data phase from 85 to 109
# steps/s a rank (2 x H200, 2026-11-30); on one GPU, the bimodal stage's 24M-node graph and settings, zc_gpu_mps and
# model_only without and with the buckets (--gemm-rows in the order GPU_CHECK_E2E_GEMM_ORDER, default 0 64 0), the heavy
# model (GPU_CHECK_E2E_GEMM_MODELS=heavy,light adds the light one). The graph is drawn first, by a --prepare-only run:
# the first call (2026-11-30, H200) drew it and ran the unbucketed rows straight after; that row built its batches 3.5x
# slower than any earlier run of it (sample 13.4, gather 12.7 ms; why is not measured), so its 69 against 110 steps/s
# does not isolate the buckets. Heavy only, both orders: 136 s an invocation, ~7.5 min in all:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,e2e_gemm_rows bash scripts/gpu_session.sh             # .wheels/
export GPU_CHECK_EXTRA_STAGE_E2E_GEMM_ROWS="timeout 200 python3 -m benchmarks.end_to_end $e2e_graph --prepare-only --out /tmp/e2e_prepare; i=0; for rows in ${GPU_CHECK_E2E_GEMM_ORDER:-0 64 0}; do i=\$((i+1)); timeout -s TERM 200 python3 -m benchmarks.end_to_end $e2e_graph --precision bf16-mixed --feature-dtype bfloat16 --x-dtype bfloat16 --models ${GPU_CHECK_E2E_GEMM_MODELS:-heavy} --steps 800 --warmup 80 --row-budget-s 12 --total-budget-s 170 --row-timeout-s 100 --configs zc_gpu_mps,model_only --gemm-rows \$rows --out \$OUT/e2e_gemm_rows-\$i-\$rows; rm -rf \$OUT/e2e_gemm_rows-\$i-\$rows/logs/*/hparams.yaml \$OUT/e2e_gemm_rows-\$i-\$rows/*.png; done"
# stage scaling_gap (issue 39, two GPUs, .wheels/ carried): where the 2-GPU rank still loses to one GPU with the row
# buckets on (scaling_table, 2026-11-30: heavy 95.1 against 108.4 steps/s a rank, light 136.9 against 158.9): the
# diagnostic's heavy and light worker groups on 1 and 2 GPUs, every run with --gemm-rows 64 (data and model-only phases,
# each rank's per-step timeline: forward, backward, all-reduce, optimizer, idle gap, fetch, hand-over), two independent
# light 1-GPU fits at once (host and MPS contention without DDP: light's stall rose from 14 to 18-21 % on 2 GPUs); then
# clique on 2 GPUs, light (it stalls less, yet trained 1-4 % slower a rank there). 348 s (2 x H200, 2026-11-30, call 44:
# the slow runs were the trainers' slow CPU draws, stage cpu_speed; docs/gpu_checks/h200x2-2026-11-30c):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,scaling_gap bash scripts/gpu_session.sh        # .wheels/ carried
gap_flags="--cache-dir /tmp/lzc --num-nodes 4000000 --gemm-rows 64 --timeout 90 --min-run-s 40 --phase-s 2.5 --warmup-batches 25 --ring-batches 16 --budget 0.1 --presample-batches 16"
export GPU_CHECK_EXTRA_STAGE_SCALING_GAP="timeout -s TERM 410 python3 -m benchmarks.scaling.diag $gap_flags --gpus 1,2 --plan heavy-worker,light-worker,pair-light-worker --deadline-s 400 --out \$OUT/scaling_gap.json; timeout -s TERM 100 python3 -m benchmarks.scaling.diag $gap_flags --gpus 2 --plan light-worker --policy clique --deadline-s 95 --out \$OUT/scaling_gap_clique.json"
# stage hetero_gap (issue 39, two GPUs, .wheels/ carried): on the typed mag graph clique trained 15 % slower a rank than
# replicate with a higher hit rate and the same stall (2 x H200, 2026-11-30, call 38): the diagnostic's per-step
# timelines of replicate on 1 and 2 GPUs, then clique on 2 (data and model-only phases), buckets on. 215 s (call 45):
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,hetero_gap bash scripts/gpu_session.sh         # .wheels/ carried
hetero_gap_flags="--graph hetero --preset mag --plan heavy-worker $gap_flags"
export GPU_CHECK_EXTRA_STAGE_HETERO_GAP="timeout -s TERM 200 python3 -m benchmarks.scaling.diag $hetero_gap_flags --gpus 1,2 --deadline-s 190 --out \$OUT/hetero_gap.json; timeout -s TERM 100 python3 -m benchmarks.scaling.diag $hetero_gap_flags --gpus 2 --policy clique --deadline-s 95 --out \$OUT/hetero_gap_clique.json"
# stage scaling_compile (issue 39, two GPUs, .wheels/ carried): the rank's step is bound by its host forward, and DDP
# waits for the slower rank's CPU (stage cpu_speed); torch.compile launches fewer kernels a step. Heavy on 1 and 2 GPUs,
# then the heavy 2-GPU run compiled (--knobs compile: vs_no_knobs, and its fwd/bwd host times), a longer warm-up for
# the recompiles. ~6 min estimated, not yet run:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,scaling_compile bash scripts/gpu_session.sh    # .wheels/ carried
export GPU_CHECK_EXTRA_STAGE_SCALING_COMPILE="timeout -s TERM 420 python3 -m benchmarks.scaling.diag $gap_flags --warmup-batches 60 --gpus 1,2 --plan heavy-worker,knobs --knob-base heavy-worker --knobs compile --deadline-s 410 --out \$OUT/scaling_compile.json"
# stage cpu_speed (any machine, ~20 s): each CPU's speed at host-bound Python and tiny CUDA launches, one thread
# pinned to each in turn, 12 passes (benchmarks.common.cpu_speed). On the lent 2 x H200 VM (2026-11-30, calls 48-49)
# every vCPU flipped within seconds between 8.5 and 15.0 ms a loop, and DDP waits each step for the slower rank:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=cpu_speed bash scripts/gpu_session.sh
export GPU_CHECK_EXTRA_STAGE_CPU_SPEED="timeout 120 python3 -m benchmarks.common.cpu_speed --passes 12 --cuda --out \$OUT/cpu_speed.json"
# stage gemm_shapes (issues 39/40): the profile found the data phase's extra host time in aten::mm/addmm (1.8-2.3 ms a
# step against 0.44-0.62 in the model phase, whose ring repeats 16 batches' shapes): what a new shape costs cuBLAS's
# host side, per heuristics cache, and the heavy step with fixed against fresh row counts. ~1.5 min on one GPU:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,gemm_shapes bash scripts/gpu_session.sh
export GPU_CHECK_EXTRA_STAGE_GEMM_SHAPES="timeout ${GPU_CHECK_GEMM_SHAPES_TIMEOUT:-300} python3 -m benchmarks.parts.gemm_shapes --out \$OUT/gemm_shapes.json; REQUIRE_CUDA=1 timeout 120 python3 -m pytest -v -rfE -p no:cacheprovider -m cuda tests/benchmarks/parts/test_gemm_shapes.py"
# stage scaling_gemm_rows (issue 39/40): the 2-GPU data and model phases with the linear products' row counts bucketed
# to 64 (knob gemm_rows: GemmRowBuckets) against the default (worker_sm_percent=10, the default share). ~3.5 min:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,scaling_gemm_rows bash scripts/gpu_session.sh    # .wheels/ carried
export GPU_CHECK_EXTRA_STAGE_SCALING_GEMM_ROWS="timeout -s TERM ${GPU_CHECK_SCALING_GEMM_ROWS_TIMEOUT:-250} python3 -m benchmarks.scaling.diag --cache-dir /tmp/lzc --out \$OUT/scaling_gemm_rows.json --num-nodes 4000000 --gpus 1,2 --plan knobs --knobs worker_sm_percent=10,gemm_rows=64 --deadline-s 240 --timeout 90 --min-run-s 40 --phase-s 2 --warmup-batches 25 --ring-batches 16 --budget 0.1 --presample-batches 16"
# Issue 42, on 4 or 8 GPUs (nvidia-h200-x4 / -x8; N = the GPUs this machine has), three calls of <= 10 min:
# (1) many_faults + many_heavy: the fault cases on N ranks with the worker under MPS (SIGKILL of rank 1 mid-epoch,
#     SIGTERM and Ctrl-C of the command; ~55 s each on 2 GPUs), then one interleaved block of the heavy model (a
#     discarded warm-up of N independent 1-GPU fits, then 1 GPU, N GPUs replicate / clique / auto, 2 GPUs) with each
#     run's model-only epoch (the model-only DDP row), the topology and the NVLink cliques in $OUT/many_heavy.json:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,many_faults,many_heavy bash scripts/gpu_session.sh    # .wheels/
# (2) many_light + many_pyg: the light model's block (1 GPU, N replicate, N clique); then benchmarks.scaling's N-GPU
#     auto run (host PSS over the data, its choice) and PyG's NeighborLoader under DDP on N GPUs; then kill_rank0 and
#     kill_worker1 on N ranks:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,many_light,many_pyg bash scripts/gpu_session.sh      # .wheels/, .pyg/
# (3) many_hetero: benchmarks.scaling --graph hetero (mag), 1 and N GPUs x replicate / clique, PyG's hetero loader on N:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,many_hetero bash scripts/gpu_session.sh              # .wheels/, .pyg/
many_n='n=$(nvidia-smi -L | grep -c ^GPU);'
many_confirm='--num-nodes 4000000 --repeats 1 --timeout 100 --min-run-s 34 --phase-s 2 --warmup-batches 25 --ring-batches 16 --budget 0.1 --presample-batches 16'
export GPU_CHECK_EXTRA_STAGE_MANY_FAULTS="$many_n LZC_TEST_GPUS=\$n REQUIRE_CUDA=1 REQUIRE_TWO_GPUS=1 timeout ${GPU_CHECK_MANY_FAULTS_TIMEOUT:-190} python3 -m pytest -v -rfEP -p no:cacheprovider --timeout=120 -m two_gpus tests/test_faults_two_gpus.py -k '${GPU_CHECK_MANY_FAULTS_SELECT:-kill_rank1 or sigterm or ctrl_c}'"
# many_tests (~3 min estimated): the multi-GPU tests that take the GPU count from LZC_TEST_GPUS (tests/helpers/test_gpus.py)
# on N: the clique over N shards in the trainer and the pipeline worker, auto's measured choice:
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,many_tests bash scripts/gpu_session.sh                 # .wheels/
export GPU_CHECK_EXTRA_STAGE_MANY_TESTS="$many_n LZC_TEST_GPUS=\$n REQUIRE_CUDA=1 REQUIRE_TWO_GPUS=1 timeout ${GPU_CHECK_MANY_TESTS_TIMEOUT:-300} python3 -m pytest -v -rfE -p no:cacheprovider --timeout=240 -m two_gpus tests/strategies/test_strategy_ddp.py -k 'clique_on_two_gpus or auto_on_two_gpus'"
# (configurations and warm-up: N stands for the machine's GPU count, e.g. GPU_CHECK_MANY_HEAVY_CONFIGS=1gpu,Ngpu-clique,Ngpu)
many_heavy_configs="${GPU_CHECK_MANY_HEAVY_CONFIGS:-1gpu,Ngpu,Ngpu-clique,Ngpu-auto,2gpu}"
many_heavy_warmup="${GPU_CHECK_MANY_HEAVY_WARMUP:-Nx1}"
export GPU_CHECK_EXTRA_STAGE_MANY_HEAVY="$many_n c=$many_heavy_configs; w=$many_heavy_warmup; timeout -s TERM ${GPU_CHECK_MANY_HEAVY_TIMEOUT:-345} python3 -m benchmarks.scaling.confirm --cache-dir /tmp/lzc --out \$OUT/many_heavy.json --models heavy --configs \${c//N/\$n} --warmup-run \${w//N/\$n} --deadline-s ${GPU_CHECK_MANY_HEAVY_DEADLINE:-335} $many_confirm"
export GPU_CHECK_EXTRA_STAGE_MANY_LIGHT="$many_n timeout -s TERM ${GPU_CHECK_MANY_LIGHT_TIMEOUT:-230} python3 -m benchmarks.scaling.confirm --cache-dir /tmp/lzc --out \$OUT/many_light.json --models light --configs 1gpu,\${n}gpu,\${n}gpu-clique --warmup-run none --deadline-s 220 $many_confirm"
export GPU_CHECK_EXTRA_STAGE_MANY_PYG="$many_n timeout -s TERM ${GPU_CHECK_MANY_PYG_TIMEOUT:-200} python3 -m benchmarks.scaling --cache-dir /tmp/lzc --out \$OUT/many_pyg.json --gpus \$n --policies auto --pyg-gpus \$n --pyg-workers 8 --pyg-site /tmp/pygsite --budgets 0.1 --pipelines worker --num-nodes 4000000 --epochs 2 --warmup-batches 30 --limit-batches 400 --run-budget-s 12 --presample-batches 16 --timeout 90; LZC_TEST_GPUS=\$n REQUIRE_CUDA=1 REQUIRE_TWO_GPUS=1 timeout 250 python3 -m pytest -v -rfEP -p no:cacheprovider --timeout=120 -m two_gpus tests/test_faults_two_gpus.py -k 'kill_rank0 or kill_worker1'"
export GPU_CHECK_EXTRA_STAGE_MANY_HETERO="$many_n timeout ${GPU_CHECK_MANY_HETERO_TIMEOUT:-500} python3 -m benchmarks.scaling --graph hetero --cache-dir /tmp/lzc --out \$OUT/many_hetero.json --preset mag --gpus 1,\$n --policies replicate,clique --budgets 0.1 --pipelines worker --epochs 2 --warmup-batches 30 --limit-batches 400 --run-budget-s 12 --presample-batches 16 --timeout 100 --prepare-timeout 150 --pyg-gpus \$n --pyg-workers 8 --pyg-site /tmp/pygsite"
# stage inference_tests (issue 41, one GPU, ~2 min estimated): the layer-wise CUDA tests (exact on every placement and
# storage, typed too, the GPU memory bound, a graph beyond the GPU's allowance, the benchmark's GPU rows).
# stage inference (one GPU, .pyg/ carried): benchmarks.inference on the e2e benchmark's 24M-node graph (drawn 19 s into
# /tmp/lzc the first time). Measured on an H200 (2026-11-28): the row processes, light: ours 62 s (36.6 s pass at batch
# 4096), PyG 294 s (201.5 s pass, ~80 s loading), sampled 30 s; heavy: ours 48 s, PyG > 410 s (cut at the stage's 465 s);
# the layer-wise CUDA tests 72 s. 2026-11-29 (commit ac926cf): `--models light,heavy --configs ours,sampled
# --sampler-placement gpu` 138 s in all (ours light 6.1 s, heavy 10.0 s a pass); light ours alone on the CPU sampler 59 s,
# on uva 47 s (the graph cached by the stage before). So one model a call for PyG, its heavy row alone in a call:
#   GPU_CHECK_INFERENCE_ARGS="--models light,heavy --configs ours,sampled --sampler-placement gpu"
#   GPU_CHECK_INFERENCE_ARGS="--models heavy --configs pyg --pyg-workers 12 --row-timeout-s 540" GPU_CHECK_INFERENCE_TIMEOUT=550
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,inference_tests bash scripts/gpu_session.sh     # .wheels/
#   GPU_CHECK_COMMIT=<sha> GPU_CHECK_STAGES=build,inference bash scripts/gpu_session.sh           # .pyg/
export GPU_CHECK_EXTRA_STAGE_INFERENCE_TESTS="REQUIRE_CUDA=1 timeout ${GPU_CHECK_INFERENCE_TEST_TIMEOUT:-400} python3 -m pytest -v -rfE -p no:cacheprovider --timeout=200 -m cuda tests/data/test_layerwise_gpu.py tests/benchmarks/inference/test_inference_benchmark.py"
export GPU_CHECK_EXTRA_STAGE_INFERENCE="timeout -s TERM ${GPU_CHECK_INFERENCE_TIMEOUT:-520} python3 -m benchmarks.inference --preset 24m --pyg-site /tmp/pygsite --cache-dir /tmp/lzc --out \$OUT/inference ${GPU_CHECK_INFERENCE_ARGS:---models light}"
export GPU_CHECK_E2E_TIMEOUT="${GPU_CHECK_E2E_TIMEOUT:-330}"
export GPU_CHECK_E2E_ARGS="${GPU_CHECK_E2E_ARGS:---preset issue20 --configs model_only,zc_gpu_mps,pyg --steps 300 --warmup 30 --row-budget-s 15 --total-budget-s 300 --cache-dir /tmp/lzc}"
export GPU_CHECK_LINK_TIMEOUT="${GPU_CHECK_LINK_TIMEOUT:-220}"
export GPU_CHECK_LINK_ARGS="${GPU_CHECK_LINK_ARGS:---preset gpu --num-nodes 2000000 --configs model_only,pyg,zc_gpu_mps --pyg-workers 12 --steps 300 --warmup 30 --row-budget-s 12 --cache-dir /tmp/lzc}"
OUT="$OUT" bash scripts/gpu_check.sh
