"""``PlanSource``: a GPU builder's ``x`` cast left to the batches' reader when LIGHTNING_ZEROCOPY_CAST_X_IN_TRAINER
asks (``defer_x_cast``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch_geometric.data import Data

from lightning_zerocopy.pipeline.source import CAST_X_IN_TRAINER_ENV, PlanSource, defer_x_cast


class _Builder:
    """Records the keywords of each ``gather_batch``; ``x`` in float32 unless told not to cast."""

    def __init__(self, on_gpu: bool, x_dtype) -> None:
        self.on_gpu, self.x_dtype, self.calls = on_gpu, x_dtype, []

    def gather_batch(self, sampled, out=None, *, marks=None, cast_x=True):
        self.calls.append({"cast_x": cast_x})
        x = torch.ones(2, 2, dtype=torch.bfloat16)
        return Data(x=x.float() if cast_x and self.x_dtype else x)


def _source(builder: _Builder) -> PlanSource:
    return PlanSource(SimpleNamespace(batch_size=2), builder, out_fields=())


def test_a_gpu_builders_cast_is_left_to_the_reader_when_the_variable_asks(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(CAST_X_IN_TRAINER_ENV, "1")
    builder = _Builder(on_gpu=True, x_dtype="float32")
    source = _source(builder)
    assert source.gather_batch(object()).x.dtype == torch.float32  # before: the builder casts
    assert defer_x_cast(source) == torch.float32
    assert source.gather_batch(object()).x.dtype == torch.bfloat16
    assert builder.calls == [{"cast_x": True}, {"cast_x": False}]


@pytest.mark.parametrize(
    ("on_gpu", "x_dtype", "env"), [(False, "float32", "1"), (True, None, "1"), (True, "float32", None), (True, "float32", "0")]
)
def test_a_host_builder_no_x_dtype_or_no_variable_keep_the_cast_in_the_source(on_gpu, x_dtype, env, monkeypatch):
    if env is None:
        monkeypatch.delenv(CAST_X_IN_TRAINER_ENV, raising=False)
    else:
        monkeypatch.setenv(CAST_X_IN_TRAINER_ENV, env)
    builder = _Builder(on_gpu=on_gpu, x_dtype=x_dtype)
    source = _source(builder)
    assert defer_x_cast(source) is None
    source.gather_batch(object())
    assert builder.calls == [{"cast_x": True}]


def test_a_source_without_the_method_is_left_alone():
    assert defer_x_cast(object()) is None
