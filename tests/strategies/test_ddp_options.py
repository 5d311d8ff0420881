"""ZeroCopyDDPStrategy hands DistributedDataParallel's own options to the wrapper it builds (its ``_setup_model``
overrides Lightning's): the DDP knobs ``benchmarks.scaling.diag`` measures for issue 39, and its own defaults
(``static_graph="auto"``, ``gradient_as_bucket_view=True``; tests/strategies/test_ddp_static_graph.py trains with them)."""

from __future__ import annotations

from typing import Optional

import pytorch_lightning as pl
import torch
from torch.nn.parallel import DistributedDataParallel

from lightning_zerocopy.strategies import ZeroCopyDDPStrategy


def _wrap(strategy: ZeroCopyDDPStrategy, module: Optional[torch.nn.Module] = None) -> DistributedDataParallel:
    strategy.parallel_devices = [torch.device("cpu")]
    return strategy._setup_model(module or torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))


def test_ddp_options_reach_the_wrapper(one_rank_group: None) -> None:
    ddp = _wrap(ZeroCopyDDPStrategy(static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=5))
    assert ddp.static_graph and ddp.gradient_as_bucket_view
    assert ddp.bucket_bytes_cap == 5 * 2**20


def test_ddp_defaults_are_static_graph_and_bucket_views_where_they_hold(one_rank_group: None) -> None:
    strategy = ZeroCopyDDPStrategy()
    ddp = _wrap(strategy)
    assert ddp.static_graph and ddp.gradient_as_bucket_view and strategy.static_graph_choice.on
    assert ddp.bucket_bytes_cap == 25 * 2**20  # torch's
    strategy = ZeroCopyDDPStrategy(find_unused_parameters=True)  # the used set may change: auto leaves it off
    ddp = _wrap(strategy)
    assert not ddp.static_graph and ddp.find_unused_parameters and "find_unused_parameters" in strategy.static_graph_choice.reason
    manual = pl.LightningModule()
    manual.layer = torch.nn.Linear(8, 2)
    manual.automatic_optimization = False  # several backward passes a step: auto leaves it off
    assert not _wrap(ZeroCopyDDPStrategy(), manual).static_graph
    ddp = _wrap(ZeroCopyDDPStrategy(static_graph=False, gradient_as_bucket_view=False))  # torch's, as asked
    assert not ddp.static_graph and not ddp.gradient_as_bucket_view
