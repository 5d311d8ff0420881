"""gather.staged: host threads into a staging buffer, one copy; bitwise ``table[ids]`` with and without a GPU cache,
ids checked before anything is read. On the CPU here (no pinning); on a GPU through ``CudaFeatureTable``
(tests/gather/test_gather_cuda.py, tests/data/test_gpu_data_path.py) and ``SegmentedFeatureCache``
(tests/cache/test_feature_cache_cuda.py)."""

from __future__ import annotations

import os

import pytest
import torch

from lightning_zerocopy.gather.read_order import ReadOrderChooser
from lightning_zerocopy.gather import staged as staged_module
from lightning_zerocopy.gather.staged import StagedGather, default_threads, staged_for

ROWS, DIM = 1000, 7


def _table(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(0)).to(dtype)


def _cache(table: torch.Tensor, hot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    slot = torch.full((ROWS,), -1, dtype=torch.int64)
    slot[hot] = torch.arange(hot.numel())
    return slot, table[hot].clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_rows_are_bitwise_the_tables_batch_after_batch(dtype: torch.dtype, id_dtype: torch.dtype) -> None:
    table = _table(dtype)
    staged = StagedGather(table, pin=False)
    gen = torch.Generator().manual_seed(1)
    for size in (300, 40, 900, 0, 300):  # grows, is reused smaller, grows again, an empty batch
        ids = torch.randint(0, ROWS, (size,), generator=gen).to(id_dtype)
        out = torch.full((size, DIM), float("nan"), dtype=dtype)
        assert staged.gather(ids, out) == size  # every row from host memory
        assert torch.equal(out, table[ids.long()])


def test_cached_rows_come_from_the_cache_and_the_rest_from_the_table() -> None:
    table = _table()
    hot = torch.arange(0, ROWS, 3)
    slot, cache = _cache(table, hot)
    cache += 1000.0  # marks the rows served from the cache
    ids = torch.randint(0, ROWS, (500,), generator=torch.Generator().manual_seed(2))
    asked = []

    def from_gpu_cache(rows: torch.Tensor, into: torch.Tensor) -> None:
        asked.append(rows)
        into.copy_(cache[slot[rows]])

    out = torch.empty(500, DIM)
    host_rows = StagedGather(table, pin=False).gather(ids, out, lambda i: slot[i] >= 0, from_gpu_cache)
    from_cache = ids % 3 == 0
    assert from_cache.any() and (~from_cache).any() and host_rows == int((~from_cache).sum())
    assert len(asked) == 1 and torch.equal(asked[0], ids[from_cache]), "the cache is asked for its rows only"
    assert torch.equal(out[from_cache], table[ids[from_cache]] + 1000.0)
    assert torch.equal(out[~from_cache], table[ids[~from_cache]])


@pytest.mark.parametrize("bad, pos", [(ROWS, 5), (-1, 0), (ROWS + 7, 19)])
def test_an_id_outside_the_table_is_named_before_any_read(bad: int, pos: int) -> None:
    ids = torch.arange(20)
    ids[pos] = bad
    out = torch.full((20, DIM), float("nan"))
    with pytest.raises(IndexError, match=rf"ids\[{pos}\] = {bad} is outside the table's rows \[0, {ROWS}\)"):
        StagedGather(_table(), pin=False).gather(ids, out)
    assert torch.isnan(out).all()


def test_an_id_outside_the_table_is_named_before_the_cache_is_asked() -> None:
    ids = torch.tensor([3, ROWS])
    with pytest.raises(IndexError, match=rf"ids\[1\] = {ROWS} is outside"):
        StagedGather(_table(), pin=False).gather(ids, torch.empty(2, DIM), lambda i: pytest.fail("asked"), print)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="2-D contiguous table in host memory"):
        StagedGather(torch.zeros(10), pin=False)
    with pytest.raises(ValueError, match=r"`out` must be a \(3, 7\) tensor of torch.float32"):
        StagedGather(_table(), pin=False).gather(torch.arange(3), torch.empty(3, DIM, dtype=torch.float16))
    with pytest.raises(ValueError, match="`on_gpu` needs `gather_on_gpu`"):
        StagedGather(_table(), pin=False).gather(torch.arange(3), torch.empty(3, DIM), lambda i: i > 0)


def test_staged_is_not_a_read_order_of_the_kernel() -> None:
    with pytest.raises(ValueError, match="not a read order of the zero-copy kernel"):
        ReadOrderChooser("staged")


def test_only_a_host_table_is_staged_and_its_kernel_keeps_a_read_order() -> None:
    staged, order = staged_for(_table(), "staged")
    assert isinstance(staged, StagedGather) and order == "direct"
    assert staged_for(_table(), "sorted") == (None, "sorted")
    assert staged_for(torch.empty(ROWS, DIM, device="meta"), "staged") == (None, "direct"), "not in host memory"


def test_each_gather_runs_on_its_own_thread_count_and_gives_the_process_its_own_back(monkeypatch) -> None:
    """Host threads are capped per gather (half the usable CPUs by default: all 16 of an H200 machine's slowed the
    training step beside it), and the process's intra-op thread count is what it was afterwards, also on an error."""
    table = _table()
    seen = []
    real = staged_module.ops.gather_rows

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(staged_module.ops, "gather_rows", recording)
    before = torch.get_num_threads()
    ids = torch.arange(0, ROWS, 7)
    StagedGather(table, pin=False, threads=1).gather(ids, torch.empty(ids.numel(), DIM))
    assert seen == [1] and torch.get_num_threads() == before
    default = StagedGather(table, pin=False)
    assert default.threads == default_threads() == max(1, len(os.sched_getaffinity(0)) // 2)
    monkeypatch.setattr(staged_module.ops, "gather_rows", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError):
        StagedGather(table, pin=False, threads=1).gather(ids, torch.empty(ids.numel(), DIM))
    assert torch.get_num_threads() == before
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            StagedGather(table, pin=False, threads=bad)
