"""The e2e benchmark's diagnostics: ``--compile`` reaches every row's module, and ``--check-every`` checks batches past
the first ones when their step starts and when it ends."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.common.measure import BatchCheck


class _Trainer:
    global_step = 0


def test_batch_check_every_nth_batch_at_its_steps_start_and_end() -> None:
    """With ``every``, batches past the first ones are checked every N steps, when the step starts and when it ends:
    a batch rewritten during its step (a slot reused before the step that reads it ran) is caught at the end."""
    from torch_geometric.data import Data

    x, y = torch.randn(10, 4), torch.arange(10)
    n_id = torch.tensor([3, 1, 7])
    check = BatchCheck(lambda step: torch.tensor([3]), x, y, count=1, every=4)
    trainer = _Trainer()
    for step in range(9):
        trainer.global_step = step
        batch = Data(x=x[n_id], y=y[n_id], n_id=n_id, edge_index=torch.tensor([[1, 2], [0, 0]]), batch_size=1)
        check.on_train_batch_start(trainer, None, batch, step)
        if step == 8:
            batch.x[1] = x[6]  # the step's slot refilled while it ran
        trainer.global_step = step + 1
        check.on_train_batch_end(trainer, None, None, batch, step)
    assert check.result["checked"] == 3 and check.result["checked_at_end"] == 2  # steps 0, 4, 8; ends of 4, 8
    assert check.result["problems"] == ["step 8: x differs from the dataset's rows at n_id (at the step's end)"]
    assert not check.result["ok"]


def test_compile_flag_compiles_every_rows_net(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--compile`` builds the row's module with ``compile=True`` (``net.compile(dynamic=True)``, recorded here
    instead of run: inductor on this CPU takes minutes) and the row records it; without it nothing is compiled."""
    from test_e2e_benchmark import model_only_row

    compiled: list[dict] = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compiled.append(kw))

    def run(*flags: str) -> dict:
        return model_only_row(tmp_path, 4, *flags)

    plain = run()
    assert plain["status"] == "ok" and plain["compile"] is False and compiled == []
    result = run("--compile")
    assert result["status"] == "ok" and result["compile"] is True and compiled == [{"dynamic": True}]


def test_gemm_rows_flag_buckets_every_rows_linear_products(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--gemm-rows N`` runs the row's model under ``GemmRowBuckets(N)`` (every linear product on a row count that is
    a multiple of N, counted here) and the row records it; without it no product is padded."""
    from test_e2e_benchmark import model_only_row

    rows: list[int] = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, *a, **kw: rows.append(x.shape[0]) or linear(x, *a, **kw))  # fmt: skip

    plain = model_only_row(tmp_path, 4)
    assert plain["status"] == "ok" and plain["gemm_rows"] == 0
    assert rows and any(r % 64 for r in rows)  # sampled row counts, unpadded
    rows.clear()
    result = model_only_row(tmp_path, 4, "--gemm-rows", "64")
    assert result["status"] == "ok" and result["gemm_rows"] == 64
    assert rows and all(r % 64 == 0 for r in rows)
