"""zerocopy::gather_rows_into (CPU) against ``table[ids]``, bitwise, plus every bad input."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy import ops


def random_table(num_rows, width, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(num_rows, width, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (num_rows, width), generator=g, dtype=torch.int64).to(dtype)


def random_ids(num_rows, n, dtype=torch.int64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_rows, (n,), generator=g).to(dtype)  # unsorted, with duplicates


def bitwise_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64])
@pytest.mark.parametrize("width", [1, 3, 7, 129])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_bitwise_equal_to_indexing(dtype, width, id_dtype):
    table = random_table(1_000, width, dtype)
    ids = random_ids(1_000, 5_000, id_dtype)
    assert torch.unique(ids).numel() < ids.numel()  # duplicates present
    out = ops.gather_rows(table, ids)
    assert bitwise_equal(out, table[ids.long()])


def test_nan_payloads_copied_bitwise():
    bits = torch.randint(-(2**31), 2**31 - 1, (64, 5), dtype=torch.int64).to(torch.int32)
    table = bits.view(torch.float32)  # includes NaNs with arbitrary payloads
    ids = random_ids(64, 200)
    assert bitwise_equal(ops.gather_rows(table, ids), table[ids])


def test_large_parallel_gather():
    table = random_table(50_000, 64, torch.float32)
    ids = random_ids(50_000, 200_000)
    assert bitwise_equal(ops.gather_rows(table, ids), table[ids])


def test_empty_ids_and_empty_table():
    table = random_table(10, 4, torch.float32)
    out = ops.gather_rows(table, torch.empty(0, dtype=torch.long))
    assert out.shape == (0, 4)
    empty = torch.empty(0, 4)
    assert ops.gather_rows(empty, torch.empty(0, dtype=torch.int32)).shape == (0, 4)
    with pytest.raises(IndexError, match="`ids`"):
        ops.gather_rows(empty, torch.tensor([0]))


def test_out_is_a_view_into_a_bigger_buffer():
    table = random_table(300, 9, torch.bfloat16)
    ids = random_ids(300, 40)
    buffer = random_table(100, 9, torch.bfloat16, seed=5)
    before = buffer.clone()
    result = ops.gather_rows(table, ids, buffer[10:50])
    assert result.data_ptr() == buffer[10:50].data_ptr()
    assert bitwise_equal(buffer[10:50], table[ids])
    assert bitwise_equal(buffer[:10], before[:10]) and bitwise_equal(buffer[50:], before[50:])


@pytest.mark.parametrize("bad", [-1, 300, 2**40])
def test_bad_id_raises_before_anything_is_written(bad):
    table = random_table(300, 4, torch.float32)
    ids = random_ids(300, 1_000)
    ids[700] = bad
    out = torch.full((1_000, 4), 7.0)
    with pytest.raises(IndexError, match=rf"`ids`.*{bad}.*position 700"):
        ops.gather_rows(table, ids, out)
    assert bool((out == 7.0).all())


def test_bad_int32_id():
    with pytest.raises(IndexError, match=r"`ids`.*-5"):
        ops.gather_rows(random_table(10, 2, torch.float16), torch.tensor([1, -5], dtype=torch.int32))


def test_bad_arguments_name_the_argument():
    table = random_table(20, 6, torch.float32)
    ids = random_ids(20, 8)
    with pytest.raises(ValueError, match="`table`.*2-D"):
        ops.gather_rows(table.view(-1), ids)
    with pytest.raises(ValueError, match="`table`.*2-D"):
        ops.gather_rows(table.view(20, 2, 3), ids)
    with pytest.raises(ValueError, match="`table`.*contiguous"):
        ops.gather_rows(table.t(), ids)
    with pytest.raises(TypeError, match="`ids`"):
        ops.gather_rows(table, ids.float())
    with pytest.raises(ValueError, match="`ids`.*1-D"):
        ops.gather_rows(table, ids.view(2, 4))
    with pytest.raises(ValueError, match="`ids`.*contiguous"):
        ops.gather_rows(table, torch.stack([ids, ids], 1)[:, 0])
    with pytest.raises(ValueError, match="`out`.*shape"):
        ops.gather_rows(table, ids, torch.empty(9, 6))
    with pytest.raises(ValueError, match="`out`.*shape"):
        ops.gather_rows(table, ids, torch.empty(8, 5))
    with pytest.raises(TypeError, match="`out`.*dtype"):
        ops.gather_rows(table, ids, torch.empty(8, 6, dtype=torch.float16))
    with pytest.raises(ValueError, match="`out`.*contiguous"):
        ops.gather_rows(table, ids, torch.empty(6, 8).t())
    with pytest.raises(ValueError, match="`out`.*contiguous"):
        ops.gather_rows(table, ids, torch.empty(8, 12)[:, :6])
    with pytest.raises(ValueError, match="`table`.*(CPU|host memory)"):
        ops.gather_rows(table.to("meta"), ids, torch.empty(8, 6))


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_opcheck(id_dtype):
    table = random_table(50, 5, torch.float32)
    ids = random_ids(50, 30, id_dtype)
    out = torch.empty(30, 5)
    torch.library.opcheck(torch.ops.zerocopy.gather_rows_into.default, (table, ids, out))


def test_locality_options_on_the_cpu() -> None:
    """One op for both devices: ``sort_ids`` is a CUDA read-order hint (same result on the CPU), and the GPU
    hot-row cache is refused on the CPU with a message naming it."""
    table = random_table(40, 3, torch.float64)
    ids = random_ids(40, 25, torch.int64)
    assert torch.equal(ops.gather_rows(table, ids, sort_ids=True), table[ids])
    slot = torch.full((40,), -1, dtype=torch.int32)
    with pytest.raises(ValueError, match="`cache_slot`.*CUDA"):
        ops.gather_rows(table, ids, cache_slot=slot, cache=table[:2].clone())
    with pytest.raises(ValueError, match="both `cache_slot` and `cache`"):
        ops.gather_rows(table, ids, cache_slot=slot)
    with pytest.raises(TypeError, match="`cache_slot`.*Int"):
        ops.gather_rows(table, ids, cache_slot=slot.long(), cache=table[:2].clone())
    out = torch.empty(25, 3, dtype=table.dtype)
    torch.library.opcheck(torch.ops.zerocopy.gather_rows_into.default, (table, ids, out, True))
