"""A deterministic, picklable stand-in for a DataModule's batch source (plan + build_batch).

Batches vary in size from step to step like sampled subgraphs do, so the tests exercise slot views, growth and
the copy of fields a builder did not write into ``out``.
"""

from __future__ import annotations

import os
import time
from typing import Mapping, Optional

import torch
from helpers import matmul_tflops
from torch_geometric.data import Data


class FakeSource:
    def __init__(
        self,
        steps: int = 8,
        batch_size: int = 16,
        features: int = 8,
        seed: int = 0,
        use_out: bool = True,
        fail_at: Optional[int] = None,
        huge_at: Optional[int] = None,
        delay: float = 0.0,
    ) -> None:
        self.steps, self.batch_size, self.features, self.seed = steps, batch_size, features, seed
        self.use_out, self.fail_at, self.huge_at, self.delay = use_out, fail_at, huge_at, delay

    def num_steps(self, epoch: int) -> int:
        return self.steps

    def plan(self, epoch: int, step: int) -> tuple[int, int, int]:
        return (epoch, step, self.seed * 1_000_003 + epoch * 10_007 + step)

    def build_batch(self, item, out: Optional[Mapping[str, torch.Tensor]] = None) -> Data:
        epoch, step, batch_seed = item
        if self.delay:
            time.sleep(self.delay)
        if self.fail_at is not None and step == self.fail_at:
            raise ValueError(f"fake builder failure at step {step}")
        g = torch.Generator().manual_seed(batch_seed)
        b = self.batch_size
        scale = 20 if self.huge_at is not None and step == self.huge_at else 1
        n = b + int(torch.randint(0, 4 * b, (1,), generator=g)) * scale
        e = int(torch.randint(n, 3 * n, (1,), generator=g))
        x = torch.randn(n, self.features, generator=g)
        if self.use_out and out is not None and out["x"].size(0) >= n:
            x = out["x"][:n].copy_(x)  # what a gather writing straight into the slot does
        hop1 = int(torch.randint(0, n - b + 1, (1,), generator=g))
        return Data(
            x=x,
            y=torch.randint(0, 5, (n,), generator=g),
            n_id=torch.randperm(10 * n, generator=g)[:n],
            e_id=torch.randint(0, 100 * n, (e,), generator=g),
            edge_index=torch.randint(0, n, (2, e), generator=g),
            input_id=torch.arange(step * b, (step + 1) * b),
            batch_size=b,
            num_sampled_nodes=[b, hop1, n - b - hop1],
            num_sampled_edges=torch.tensor([e // 2, e - e // 2]),
        )


class TflopsProbeSource(FakeSource):
    """A FakeSource whose batches also carry the producer's own matmul rate (``batch.tflops``), so the trainer
    can see the SM share the worker process actually gets."""

    def build_batch(self, item, out=None):
        data = super().build_batch(item, out)
        data.tflops = matmul_tflops()
        data.mps_percent = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
        return data


class TwoStageSource(FakeSource):
    """A FakeSource split into ``sample_batch`` and ``gather_batch`` (``build_batch`` = gather of sample).

    With ``require_overlap`` the gather of step ``s`` waits (up to ``overlap_wait`` s) until the sample of step
    ``s + 1`` has *started* on another thread and raises otherwise: it only completes when the producer
    samples one batch ahead concurrently with the gather, as the three-stage pipeline must.
    """

    def __init__(self, *args, require_overlap: bool = False, overlap_wait: float = 10.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.require_overlap, self.overlap_wait = require_overlap, overlap_wait

    def sample_batch(self, item):
        import threading

        started = self.__dict__.setdefault("_started_any", {})
        started.setdefault(item, threading.Event()).set()
        return (item, threading.get_ident())

    def gather_batch(self, sampled, out=None):
        import threading

        item, sampler_thread = sampled
        if sampler_thread == threading.get_ident():
            raise RuntimeError("the batch was sampled on the gathering thread")
        epoch, step, _ = item
        if self.require_overlap and step + 1 < self.steps:
            started = self.__dict__.setdefault("_started_any", {})
            nxt = self.plan(epoch, step + 1)
            event = started.setdefault(nxt, threading.Event())
            if not event.wait(self.overlap_wait):
                raise RuntimeError(f"step {step} was gathered without the sample of step {step + 1} running ahead")
        return FakeSource.build_batch(self, item, out)

    def build_batch(self, item, out=None):
        return self.gather_batch(self.sample_batch(item), out)

    def reference(self, epoch: int, step: int):
        """The batch of (epoch, step), built directly (no stages, no probes)."""
        return FakeSource.build_batch(self, self.plan(epoch, step))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_started_any", None)
        return state


class HybridSource(TwoStageSource):
    """A TwoStageSource that samples on two fake devices through the producer's hybrid dispatcher.

    ``sample_batch(item, lane)`` gives the same sample whatever the lane (as the CPU and GPU samplers do), and
    sleeps ``lane_delay[lane]`` seconds; ``fail_at`` makes the sample (not the gather) of that step raise.
    """

    def __init__(self, *args, lane_delay: Optional[dict] = None, sample_fail_at: Optional[int] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lane_delay = dict(lane_delay or {"cpu": 0.0, "gpu": 0.0})
        self.sample_fail_at = sample_fail_at

    def hybrid_policy(self):
        from lightning_zerocopy.sampling import HybridPolicy

        return HybridPolicy(list(self.lane_delay), explore_every=4, warmup=0)

    def expected_size(self, item) -> float:
        return float(self.batch_size)

    def sample_batch(self, item, lane=None):
        if lane is None:
            raise RuntimeError("the hybrid producer must name the lane")
        if self.sample_fail_at is not None and item[1] == self.sample_fail_at:
            raise IndexError(f"fake sampler failure at step {item[1]} on {lane}")
        time.sleep(self.lane_delay[lane])
        return super().sample_batch(item)


def row_sources(n_id: torch.Tensor) -> tuple[int, int, int]:
    """Where :class:`FakeRowCache` says each row of ``n_id`` came from: ``id % 4`` 0 local, 1 peer, else host."""
    where = n_id % 4
    local, peer = int((where == 0).sum()), int((where == 1).sum())
    return local, peer, n_id.numel() - local - peer


class FakeRowCache:
    """A CPU stand-in for a GPU feature cache (``SegmentedFeatureCache``): counts the rows it is asked for by where
    :func:`row_sources` says they came from; tracked like the strategy's caches (``cache_spec.track_cache``)."""

    row_bytes = 32

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.plan = SimpleNamespace(digest="fake-plan")
        self.closed = False
        self._counts = torch.zeros(3, dtype=torch.int64)

    def gather(self, n_id: torch.Tensor) -> None:
        self._counts += torch.tensor(row_sources(n_id))

    def counts(self):
        from lightning_zerocopy.cache.segmented import CacheCounts

        return CacheCounts(*(int(v) for v in self._counts.tolist()))

    def close(self) -> None:
        self.closed = True


class CachedSource(FakeSource):
    """A FakeSource whose producer process opens a :class:`FakeRowCache` and "gathers" every batch's ``n_id``
    through it (the trainer-side reference batches, built without ``open``, count nothing)."""

    def open(self, scope=None) -> None:
        from lightning_zerocopy.cache.sharded_provider import track_cache

        self._cache = track_cache(FakeRowCache())

    def close(self) -> None:
        cache = self.__dict__.pop("_cache", None)
        if cache is not None:
            cache.close()

    def build_batch(self, item, out=None):
        data = super().build_batch(item, out)
        cache = self.__dict__.get("_cache")
        if cache is not None:
            cache.gather(data.n_id)
        return data

    def expected_rows(self, epoch: int, steps=None) -> tuple[int, int, int]:
        """(local, peer, host) rows of the batches ``steps`` (default: all) of ``epoch``."""
        totals = [0, 0, 0]
        for step in range(self.steps) if steps is None else steps:
            for i, n in enumerate(row_sources(FakeSource.build_batch(self, self.plan(epoch, step)).n_id)):
                totals[i] += n
        return tuple(totals)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_cache", None)
        return state
