"""The end-to-end benchmark's tables: rows (data paths), models and graph presets, as data; and what a run derives from
them: the graph's arguments, why a row cannot run here, an MPS row's launcher command (the link and step benchmarks
use them too).

A row is selected by name (``--configs a,b,c``). Rows whose feature this build lacks (a Strategy, a sampler
placement, PyG's sampling backend, MPS, a GPU) are reported as skipped with the reason, never silently run as
something else, so new rows can be listed here before the feature lands.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from benchmarks.common.rows import pick_rows

__all__ = ["CPU_DATA", "MODELS", "MPS_PIPELINE", "PRECISIONS", "PRESETS", "ROWS", "ZC_GPU_DATA", "ModelSpec", "Preset", "Row",
           "graph_kwargs", "launcher_share", "mps_prefix", "one_model_rows", "parse_share", "resolve_precision",
           "select_rows", "worker_share"]  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One data path.

    Attributes:
        name: the ``--configs`` name.
        kind: ``"ours"`` (ZeroCopyDataModule through the Trainer), ``"pyg"`` (PyG's NeighborLoader through the
            Trainer), ``"model_only"`` (the same batches pre-staged on the device), ``"stages"`` (no training:
            per-stage batch build times) or ``"sample_alone"`` (no training: the sampler alone on an idle GPU).
        doc: one line for the report.
        data: ZeroCopyDataModule keyword arguments (``hot_fraction`` is turned into ``hot_rows``).
        pipeline: PipelineCallback keyword arguments, or None for no pipeline. A ``worker_sm_percent`` here is the
            row's own MPS share and wins over ``--worker-sm-percent`` (:func:`worker_share`).
        strategy: ``(import path, keyword arguments)`` of a Strategy class, or None for Lightning's default.
        needs_cuda: the row only means something on a GPU.
        env: environment variables set in the row's process (its pipeline worker inherits them).
        trainer_mps: the trainer is an MPS client (at the trainer's share) even with no pipeline worker.
    """

    name: str
    kind: str
    doc: str
    data: dict[str, Any] = field(default_factory=dict)
    pipeline: Optional[dict[str, Any]] = None
    strategy: Optional[tuple[str, dict[str, Any]]] = None
    needs_cuda: bool = True
    env: dict[str, str] = field(default_factory=dict)
    trainer_mps: bool = False

    @property
    def mps(self) -> bool:
        """Whether the row runs the trainer (and the pipeline worker, if any) as MPS clients, started through the
        launcher."""
        return bool(self.pipeline and self.pipeline.get("mps")) or self.trainer_mps

    @property
    def features_in_host_memory(self) -> bool:
        """Whether training reads (most) feature rows from host memory: our rows, except all rows cached on the GPU."""
        return self.kind == "ours" and self.data.get("hot_fraction") != 1.0


def _zero_copy_rows() -> list[Row]:
    rows = []
    for place in ("cpu", "uva", "gpu"):
        data = {"sampler_placement": place, "gather": "zerocopy"}
        where = {"cpu": "CPU sampler threads", "uva": "GPU sampler over pinned host graph", "gpu": "GPU sampler, graph in GPU memory"}[place]
        rows += [
            Row(f"zc_{place}", "ours", f"{where}, zero-copy gather, no pipeline", data),
            Row(f"zc_{place}_inproc", "ours", f"{where}, zero-copy gather, PipelineCallback in-process", data,
                pipeline={"mode": "in_process"}),
            Row(f"zc_{place}_mps", "ours", f"{where}, zero-copy gather, PipelineCallback worker + MPS", data,
                pipeline={"mode": "worker", "mps": True}),
        ]  # fmt: skip
    return rows


def _share_rows() -> list[Row]:
    """``zc_gpu_mps`` with the worker's MPS share fixed by the row (20, 30 %) or chosen while training (auto)."""
    data, mps = {"sampler_placement": "gpu", "gather": "zerocopy"}, {"mode": "worker", "mps": True}
    rows = [Row(f"zc_gpu_mps_{p}", "ours", f"as zc_gpu_mps, the worker's MPS share {p} % (the trainer {100 - p} %)", data,
                pipeline={**mps, "worker_sm_percent": p}) for p in (20, 30)]  # fmt: skip
    rows += [Row(f"zc_gpu_mps{'' if p == 10 else f'_{p}'}_full", "ours", f"as zc_gpu_mps, the worker's MPS share {p} % "
                 "and the trainer not limited (trainer_sm_percent 100: MPS caps each client)", data,
                 pipeline={**mps, "worker_sm_percent": p, "trainer_sm_percent": 100}) for p in (10, 20)]  # fmt: skip
    return rows + [Row("zc_gpu_mps_auto", "ours", "as zc_gpu_mps, worker_sm_percent='auto': the smallest of 10/20/30 % "
                       "whose build time fits in the step, calibrated while training (the trainer keeps 90 %; steps/s "
                       "include the calibration's steps); the report gives the share chosen", data,
                       pipeline={**mps, "worker_sm_percent": "auto"})]  # fmt: skip


#: the GPU sampler with the zero-copy gather, and the pipeline worker under MPS (rows here, link and hetero rows)
ZC_GPU_DATA = {"sampler_placement": "gpu", "gather": "zerocopy"}
MPS_PIPELINE = {"mode": "worker", "mps": True}

MODEL_ONLY_MPS = Row("model_only_mps", "model_only", "as model_only, the trainer an MPS client at the trainer's share "
                     "(90 %) with no worker beside it: what being a client costs the step, apart from the worker's "
                     "loads", trainer_mps=True)  # fmt: skip

_ROW_LIST: list[Row] = [
    Row("pyg", "pyg", "PyG NeighborLoader: worker processes (best of --pyg-workers), pin_memory, "
        ".to(device, non_blocking=True)", needs_cuda=False),  # fmt: skip
    Row("cpu", "ours", "CPU sampler threads + CPU gather, batch copied to the device", {"sampler_placement": "cpu", "gather": "cpu"},
        needs_cuda=False),  # fmt: skip
    Row("cpu_inproc", "ours", "CPU sampler + CPU gather, PipelineCallback in-process",
        {"sampler_placement": "cpu", "gather": "cpu"}, pipeline={"mode": "in_process"}, needs_cuda=False),  # fmt: skip
    Row("cpu_mps", "ours", "CPU sampler + CPU gather, PipelineCallback worker + MPS",
        {"sampler_placement": "cpu", "gather": "cpu"}, pipeline={"mode": "worker", "mps": True}),  # fmt: skip
    *_zero_copy_rows(),
    *_share_rows(),
    Row("zc_gpu_mps_staged", "ours", "as zc_gpu_mps, gather_mode='staged': the worker's host threads gather the rows "
        "into a pinned buffer, the copy engines move it (no zero-copy reads beside training)",
        {"sampler_placement": "gpu", "gather": "zerocopy", "gather_mode": "staged"},
        pipeline={"mode": "worker", "mps": True}),  # fmt: skip
    Row("zc_gpu_mps_spin", "ours", "as zc_gpu_mps, the pipeline's host threads wait for the GPU spinning on a core "
        "(CUDA's default; LIGHTNING_ZEROCOPY_SPIN_WAITS=1) where they sleep by default",
        ZC_GPU_DATA, pipeline=MPS_PIPELINE, env={"LIGHTNING_ZEROCOPY_SPIN_WAITS": "1"}),
    Row("zc_gpu_mps_depth3", "ours", "as zc_gpu_mps, three slots a loader (depth 3) where ping-pong has two: a slot "
        "freed once the GPU has run its step has one more step to be refilled before the trainer asks for it",
        ZC_GPU_DATA, pipeline={**MPS_PIPELINE, "depth": 3}),
    Row("zc_gpu_hot", "ours", "GPU sampler, zero-copy gather, --cache-fraction of rows cached on the GPU (hot_rows)",
        {"sampler_placement": "gpu", "gather": "zerocopy", "hot_fraction": "cache_fraction"}),  # fmt: skip
    Row("zc_gpu_hot_mps", "ours", "as zc_gpu_hot, PipelineCallback worker + MPS",
        {"sampler_placement": "gpu", "gather": "zerocopy", "hot_fraction": "cache_fraction"},
        pipeline={"mode": "worker", "mps": True}),  # fmt: skip
    Row("zerocopy_ddp", "ours", "ZeroCopyDDPStrategy with --cache-budget, GPU sampler, zero-copy gather",
        {"sampler_placement": "gpu", "gather": "zerocopy"},
        strategy=("lightning_zerocopy.strategies.ZeroCopyDDPStrategy", {"cache_budget": "cache_budget"})),  # fmt: skip
    Row("zerocopy_ddp_mps", "ours", "as zerocopy_ddp, PipelineCallback worker + MPS",
        {"sampler_placement": "gpu", "gather": "zerocopy"}, pipeline={"mode": "worker", "mps": True},
        strategy=("lightning_zerocopy.strategies.ZeroCopyDDPStrategy", {"cache_budget": "cache_budget"})),  # fmt: skip
    Row("hybrid", "ours", "sampler_placement='hybrid', zero-copy gather", {"sampler_placement": "hybrid", "gather": "zerocopy"}),
    Row("hybrid_mps", "ours", "sampler_placement='hybrid', zero-copy gather, PipelineCallback worker + MPS",
        {"sampler_placement": "hybrid", "gather": "zerocopy"}, pipeline={"mode": "worker", "mps": True}),  # fmt: skip
    Row("auto_mps", "ours", "sampler_placement='auto' (hybrid where it measures faster), zero-copy gather, "
        "PipelineCallback worker + MPS", {"sampler_placement": "auto", "gather": "zerocopy"},
        pipeline={"mode": "worker", "mps": True}),  # fmt: skip
    Row("all_in_gpu", "ours", "graph and all feature rows in GPU memory, same GPU sampler",
        {"sampler_placement": "gpu", "gather": "zerocopy", "hot_fraction": 1.0}),  # fmt: skip
    Row("stages", "stages", "not a training row: median ms per batch of sampling, gather and the copy to the device, "
        "per sampler placement and gather, with nothing else running", needs_cuda=False),  # fmt: skip
    Row("sample_alone", "sample_alone", "not a training row: ms per batch of sample_batch alone, back to back on an "
        "otherwise idle GPU (lightning_zerocopy.data.stage_bounds.time_sampling), per sampler placement: the bound of the "
        "producer's sample stage", needs_cuda=False),  # fmt: skip
    Row("model_only", "model_only", "the same batches pre-staged in device memory: the compute bound", needs_cuda=False),
    MODEL_ONLY_MPS,
]

#: Every row by name, in the report's order.
ROWS: dict[str, Row] = {row.name: row for row in _ROW_LIST}

#: the CPU data options of the one-model benchmarks' rows (link, hetero)
CPU_DATA = {"sampler_placement": "cpu", "gather": "cpu"}


def one_model_rows(pyg_loader: str) -> dict[str, Row]:
    """The rows every one-model benchmark (link, hetero) has, by name: ``pyg`` (``pyg_loader``, PyG's loader as the
    report names it), ``cpu``, ``zc_gpu``, ``zc_gpu_mps``, ``model_only`` and ``model_only_mps``."""
    return {row.name: row for row in [
        Row("pyg", "pyg", f"PyG {pyg_loader}: worker processes (best of --pyg-workers), pin_memory, "
            ".to(device, non_blocking=True)", needs_cuda=False),
        Row("cpu", "ours", "CPU sampler threads + CPU gather, batch copied to the device", CPU_DATA, needs_cuda=False),
        Row("zc_gpu", "ours", "GPU sampler, zero-copy gather from host memory, no pipeline", ZC_GPU_DATA),
        Row("zc_gpu_mps", "ours", "GPU sampler, zero-copy gather, PipelineCallback worker + MPS", ZC_GPU_DATA,
            pipeline=MPS_PIPELINE),
        Row("model_only", "model_only", "the same kind of batches pre-staged in device memory: the compute bound",
            needs_cuda=False),
        MODEL_ONLY_MPS,
    ]}  # fmt: skip


@dataclass(frozen=True)
class ModelSpec:
    """A model of ``lightning_zerocopy.models`` (``arch``: ``GraphSAGE`` or ``GAT``), its size and fanouts."""

    name: str
    hidden: int
    layers: int
    fanouts: tuple[int, ...]
    arch: str = "GraphSAGE"


MODELS: dict[str, ModelSpec] = {
    "light": ModelSpec("light", 128, 2, (10, 5)),
    "heavy": ModelSpec("heavy", 256, 3, (15, 10, 5)),
    "gat": ModelSpec("gat", 128, 2, (10, 5), arch="GAT"),  # 4 heads of 32; not in the presets (--models ...,gat)
}


@dataclass(frozen=True)
class Preset:
    """Graph size, step counts and time budgets of a named run; every field is also a command-line flag."""

    num_nodes: int
    avg_degree: float
    features: int
    classes: int
    batch_size: int
    steps: int
    warmup: int
    val_every: int
    val_batches: int
    row_budget_s: float
    total_budget_s: float
    row_timeout_s: float
    configs: str
    models: str
    pyg_workers: str
    threads: int


# most telling first: a run that hits --total-budget-s skips the tail
_GPU_SMALL = "model_only,pyg,zc_gpu_mps,all_in_gpu,stages,cpu,zc_gpu,zc_gpu_inproc,zc_cpu_mps,cpu_mps,zc_uva_mps,zc_gpu_hot,zerocopy_ddp,hybrid_mps"

PRESETS: dict[str, Preset] = {
    # the CI run: CPU-only rows on a few thousand nodes; one thread per row process (a shared CI box: two
    # spinning threads on a loaded two-core machine ran the light model 5-8x slower than one)
    "ci": Preset(4_000, 10.0, 32, 8, 128, 24, 4, 8, 2, 30.0, 0.0, 300.0, "pyg,cpu,cpu_inproc,model_only,stages,sample_alone,zc_gpu", "light", "0", 1),
    # 1M nodes, 20M edges, 0.5 GB of features; 40-60 s per row for both models on an H200 (2026-11-23), and
    # --total-budget-s stops before the tail rows
    "small": Preset(1_000_000, 20.0, 128, 16, 1024, 300, 30, 30, 2, 20.0, 420.0, 150.0, _GPU_SMALL, "light,heavy", "4,8,12", 0),
    # >= 25 GB of fp32 features in host memory and >= 500M edges (50M nodes x 128; sized for 128 GiB RAM, 64 GiB disk)
    "headline": Preset(50_000_000, 10.2, 128, 16, 1024, 600, 50, 100, 2, 40.0, 540.0, 300.0,
                       "model_only,pyg,zc_gpu_mps,all_in_gpu,stages,zc_cpu_mps,zc_gpu_hot_mps,zerocopy_ddp_mps,hybrid_mps",
                       "light,heavy", "8,12", 0),  # fmt: skip
    # issue 20's graph: 20M nodes x 128 fp32 (10.2 GB of features in host memory), ~200M edges; the rows the issue's
    # aims name, PyG with 12 workers (no sweep). Sized for one device call of ~8 min on an H200: graph drawn on the GPU
    # ~35 s; per row process (both models) ~40 s model_only, ~70 s zc_gpu_mps, ~85 s pyg (30 s of heavy training at
    # ~13 steps/s), ~45 s all_in_gpu (last: --total-budget-s skips it first) -- scaled from the headline run's 50M-node
    # rows (docs/e2e/headline-h200), about 4.5 min in all
    "issue20": Preset(20_000_000, 10.0, 128, 16, 1024, 600, 50, 100, 2, 30.0, 330.0, 200.0,
                      "model_only,zc_gpu_mps,pyg,all_in_gpu", "light,heavy", "12", 0),  # fmt: skip
}

#: ``--precision`` values (Lightning's ``Trainer(precision=...)``); ``auto``: bf16-mixed on a GPU, 32-true on the CPU.
PRECISIONS = ("auto", "bf16-mixed", "16-mixed", "32-true", "32", "bf16-true", "64-true")


def resolve_precision(precision: str, cuda: bool) -> str:
    """``precision``, with ``auto`` made ``bf16-mixed`` on a GPU and ``32-true`` on the CPU."""
    if precision == "auto":
        return "bf16-mixed" if cuda else "32-true"
    return precision


def select_rows(configs: str) -> list[Row]:
    """The rows named in a comma-separated list (``all`` = every row), in the order given (see :func:`pick_rows`)."""
    return pick_rows(configs, ROWS, "--configs")


def parse_share(text: str) -> Union[int, str]:
    """``--worker-sm-percent``: a share of SMs in [1, 99], or ``auto`` (``PipelineCallback(worker_sm_percent="auto")``).

    Raises:
        argparse.ArgumentTypeError: anything else (argparse reports it under the flag's name).
    """
    if text.strip().lower() == "auto":
        return "auto"
    try:
        percent = int(text)
    except ValueError:
        percent = 0
    if not 1 <= percent <= 99:
        raise argparse.ArgumentTypeError(f"a share of SMs in [1, 99] or 'auto', got {text!r}")
    return percent


def worker_share(row: Row, flag: Union[int, str]) -> Optional[Union[int, str]]:
    """The pipeline worker's MPS share for ``row``: the row's own ``worker_sm_percent`` where its pipeline names
    one, else ``flag`` (``--worker-sm-percent``); None for a row without MPS."""
    if not row.mps:
        return None
    return (row.pipeline or {}).get("worker_sm_percent", flag)


def launcher_share(share: Union[int, str]) -> int:
    """The share the MPS launcher starts with (``--worker-sm-percent`` of ``mps_launcher``): ``share``, or for ``auto``
    the first of the calibration's ladder (10 %), so the trainer gets the rest (90 %) as the callback expects."""
    if share == "auto":
        from lightning_zerocopy.pipeline.share_choice import SHARE_LADDER

        return SHARE_LADDER[0]
    return int(share)


def graph_kwargs(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """SyntheticGraph's arguments for this run (the same in every row's process, so all load one cache)."""
    return dict(num_nodes=args.num_nodes, avg_degree=args.avg_degree, num_features=args.features,
                num_classes=args.classes, homophily=args.homophily, feature_signal=args.feature_signal,
                seed=args.seed, device=device, cache_dir=args.cache_dir)  # fmt: skip


def _precheck(row: Any) -> Optional[str]:
    """Why ``row`` cannot run here, found without starting its process (the process checks the rest)."""
    import importlib.util

    import torch

    if row.needs_cuda and not (torch.version.cuda and torch.cuda.device_count() > 0):  # no driver initialization
        return "needs a CUDA GPU (none here)"
    if row.kind == "pyg" and not any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse")):
        return ("PyG's NeighborLoader needs pyg-lib or torch-sparse; neither is installed here "
                "(on the GPU box: unpack .pyg/*.tgz and pass --pyg-site DIR)")  # fmt: skip
    return None


def mps_prefix(args: argparse.Namespace, row: Row) -> list[str]:
    """The MPS launcher's command line before an MPS row's process: the row's worker share (:func:`worker_share`;
    ``auto`` starts at the ladder's first, 10 %, so the trainer has 90 %). Waits up to 60 s for the previous row's
    daemon to quit."""
    from lightning_zerocopy.pipeline import mps

    deadline = time.monotonic() + 60  # the previous row's daemon may still be quitting
    while mps.mps_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    share = launcher_share(worker_share(row, args.worker_sm_percent))
    trainer = (row.pipeline or {}).get("trainer_sm_percent")
    own = [] if trainer is None else ["--trainer-sm-percent", str(trainer)]
    return [sys.executable, "-m", "lightning_zerocopy.pipeline.mps_launcher", "--worker-sm-percent", str(share), *own, "--"]
