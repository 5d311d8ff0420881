"""The PyG baseline's helpers, shared by the node (``benchmarks/end_to_end/``) and link (``benchmarks/end_to_end/link/``) benchmarks:
which sampling backend PyG's loaders can use here, and the worker-count sweep with a fit on the fastest loader."""

from __future__ import annotations

import gc
import time
from typing import Any, Callable, Iterator

import torch

from benchmarks.common.measure import _sync
from benchmarks.common.rows import RowUnavailable

__all__ = ["fit_on_best_pyg_loader", "pyg_sampling_backends"]


def pyg_sampling_backends(loader: str) -> list[str]:
    """The neighbor-sampling backends PyG's ``loader`` can use here (``pyg_lib``, ``torch_sparse``).

    Raises:
        RowUnavailable: neither imports (a broken wheel counts as missing).
    """
    import importlib

    backends = []
    for name in ("pyg_lib", "torch_sparse"):
        try:
            importlib.import_module(name)
            backends.append(name)
        except Exception:  # noqa: BLE001 - a broken wheel is as unavailable as a missing one
            pass
    if not backends:
        raise RowUnavailable(f"PyG's {loader} needs pyg-lib or torch-sparse; neither imports here "
                             "(on the GPU box: unpack .pyg/*.tgz and pass --pyg-site DIR)")  # fmt: skip
    return backends


def fit_on_best_pyg_loader(trainer: Any, model: Any, train_loader: Callable[[int], Any], val_loader: Callable[[int], Any],
                           args: Any, device: torch.device, backends: Any, pyg_sampler_build_s: float) -> dict[str, Any]:  # fmt: skip
    """Time ``train_loader(workers)`` for each of ``args.pyg_workers`` (when there are several), then fit ``model``
    through a DataModule of the fastest count's train and val loaders, PyG batches moved as users move them; returns
    the fit's time and the sweep's figures."""
    import pytorch_lightning as pl

    sweep = {}
    workers = [int(w) for w in str(args.pyg_workers).split(",") if w.strip()]
    for w in workers if len(workers) > 1 else []:
        torch.manual_seed(args.seed)
        sweep[w] = _loader_rate(train_loader(w), device, args.sweep_batches)
    best = max(sweep, key=sweep.get) if sweep else workers[0]
    gc.collect()  # no loader of the sweep (or of a previous model) may be collected inside a forked worker

    class PyGData(pl.LightningDataModule):
        def train_dataloader(self) -> Any:
            return train_loader(best)

        def val_dataloader(self) -> Any:
            return val_loader(best)

        def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
            return batch.to(device, non_blocking=True)

    t0 = time.perf_counter()
    trainer.fit(model, datamodule=PyGData())
    return {"fit_s": time.perf_counter() - t0, "fit_t0": t0, "pyg_workers": best, "pyg_sweep_batches_per_s": sweep,
            "pyg_backends": backends, "pyg_sampler_build_s": pyg_sampler_build_s}  # fmt: skip


def _loader_rate(loader: Any, device: torch.device, batches: int) -> float:
    """Batches/s of a loader delivering to ``device`` (``.to(non_blocking=True)``), after the first 5 batches."""
    it: Iterator[Any] = iter(loader)
    t0, n = 0.0, 0
    try:
        for i, batch in enumerate(it):
            batch.to(device, non_blocking=True)
            if i == 4:
                _sync(device)
                t0 = time.perf_counter()
            elif i > 4:
                n += 1
            if n >= batches:
                break
        _sync(device)
        return n / max(time.perf_counter() - t0, 1e-9)
    finally:
        # Stop this loader's workers and pin-memory thread now. Left to the garbage collector (the persistent
        # iterator sits in a reference cycle with its loader), the stale iterator was collected inside the next
        # loader's forked workers, whose shutdown then blocked, and the row hung (seen on the H200, 2026-11-23).
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        loader._iterator = None
        del it
        gc.collect()
