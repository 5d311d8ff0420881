"""One layer-wise pass over a set-up DataModule's graph, on the CPU or a GPU (``tests/data/test_layerwise*.py``)."""

from __future__ import annotations

from typing import Any

import torch

from lightning_zerocopy.data.layerwise import LayerwisePass, LayerwiseResult
from lightning_zerocopy.data.layerwise_options import LayerwiseOptions
from lightning_zerocopy.models.layerwise import layerwise_module


def run_pass(dm: Any, model: Any, device: torch.device = torch.device("cpu"), as_the_command: bool = False,
             **kwargs: Any) -> LayerwiseResult:  # fmt: skip
    """``model``'s layer-wise pass over ``dm``'s graph on ``device`` (small batches by default: many per layer) with
    ``dm``'s sampler placement (``as_the_command``: the placement the predict command takes, from
    ``dm.layerwise.sampler_placement``); ``kwargs``: :class:`LayerwiseOptions` fields, then :class:`LayerwisePass`
    arguments."""
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in LayerwiseOptions.__dataclass_fields__}
    options = {"batch_size": 50, "max_batch_edges": 300, **options}
    fanouts = {et: [-1] for et in dm.schema.edge_types} if dm.schema.is_typed else [-1]
    if isinstance(model, torch.nn.Module):
        model.to(device).eval()
    builder = dm.builder("predict", layerwise=True) if as_the_command else dm.builder("predict", fanouts=fanouts)
    builder.open(dm.resources)
    try:
        return LayerwisePass(builder, layerwise_module(model), LayerwiseOptions(**options), device=device,
                             **kwargs).run()  # fmt: skip
    finally:
        builder.close()
