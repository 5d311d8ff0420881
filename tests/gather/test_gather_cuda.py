"""CUDA zero-copy gather (``zerocopy::gather_rows_into``, with address order and hot-row cache) against
``table[ids]``, bitwise.

Tables live in registered host memory (``cudaHostRegister``, read over PCIe), in ``pin_memory()`` memory or on
the GPU; rows of every width and alignment; direct and address-ordered reads; the GPU hot-row cache; streams;
bad ids.
"""

from __future__ import annotations

import pytest
import torch
from helpers import exclusive_host_copy, opcheck

from lightning_zerocopy import ops

pytestmark = pytest.mark.cuda

WIDTHS = [1, 3, 7, 33, 100, 128, 129, 512]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def random_table(num_rows: int, width: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(num_rows, width, generator=g) * 3 + 1).to(dtype)
    return torch.randint(1, 255, (num_rows, width), generator=g, dtype=torch.int64).to(dtype)


def random_ids(num_rows: int, n: int, dtype: torch.dtype = torch.int64, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_rows, (n,), generator=g).to(dtype)  # any order, with duplicates


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu(), b.cpu()
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def poisoned(shape, dtype) -> torch.Tensor:
    """A CUDA output buffer full of a recognisable non-zero pattern (so unwritten rows show)."""
    out = torch.empty(shape, dtype=dtype, device="cuda")
    out.view(torch.uint8).fill_(0xA5)
    return out


class Placed:
    """A table in one of the placements the CUDA kernel reads from; registered memory is unregistered on close."""

    def __init__(self, table: torch.Tensor, placement: str) -> None:
        from lightning_zerocopy.graph import register_host_tensor

        self.registration = None
        if placement == "registered":
            self.table = exclusive_host_copy(table)
            self.registration = register_host_tensor(self.table)
        elif placement == "pinned":
            self.table = table.pin_memory()
        else:
            self.table = table.cuda()

    def close(self) -> None:
        if self.registration is not None:
            self.registration.close()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_bitwise_equal_to_indexing_all_placements_and_orders(dtype: torch.dtype, width: int) -> None:
    host = random_table(997, width, dtype, seed=width)
    for placement in ("registered", "pinned", "cuda"):
        placed = Placed(host, placement)
        try:
            for id_dtype in (torch.int32, torch.int64):
                ids = random_ids(997, 3001, id_dtype, seed=width + 7).cuda()
                expected = host[ids.long().cpu()]
                out = poisoned((3001, width), dtype)
                ops.gather_rows(placed.table, ids, out)
                assert bitwise_equal(out, expected), (placement, id_dtype, "gather_rows_into")
                for sort_ids in (False, True):
                    out = poisoned((3001, width), dtype)
                    ops.gather_rows(placed.table, ids, out, sort_ids=sort_ids)
                    assert bitwise_equal(out, expected), (placement, id_dtype, sort_ids)
        finally:
            placed.close()


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32, torch.int64])
@pytest.mark.parametrize("width", [1, 3, 5, 17])
def test_misaligned_table_and_out_views(dtype: torch.dtype, width: int) -> None:
    # The table starts one element into its buffer and out is a view at row 3 of a bigger buffer, so neither
    # is 16-byte aligned: the kernel must fall back to narrower accesses and still copy every byte.
    num_rows = 513
    flat = random_table(1, num_rows * width + 1, dtype, seed=3).view(-1)
    placed_flat = exclusive_host_copy(flat)
    from lightning_zerocopy.graph import register_host_tensor

    with register_host_tensor(placed_flat):
        table = placed_flat[1:].view(num_rows, width)
        assert table.data_ptr() % 16 != 0
        ids = random_ids(num_rows, 800, seed=4).cuda()
        for sort_ids in (False, True):
            buffer = poisoned((806, width), dtype)
            before = buffer.clone()
            view = buffer[3:803]
            ops.gather_rows(table, ids, view, sort_ids=sort_ids)
            assert bitwise_equal(view, table[ids.cpu()])
            assert bitwise_equal(buffer[:3], before[:3]) and bitwise_equal(buffer[803:], before[803:])


def test_large_rows_and_many_ids() -> None:
    # Rows of 2 KiB and 8 KiB (several passes of a warp) and enough ids for the grid-stride loop to wrap.
    for width, n in ((512, 200_000), (2048, 20_000)):
        host = random_table(5_000, width, torch.float32, seed=width)
        placed = Placed(host, "registered")
        try:
            ids = random_ids(5_000, n, seed=5).cuda()
            for sort_ids in (False, True):
                out = ops.gather_rows(placed.table, ids, sort_ids=sort_ids)
                assert bitwise_equal(out, host[ids.cpu()])
        finally:
            placed.close()


def test_empty_ids_and_zero_width() -> None:
    placed = Placed(random_table(10, 4, torch.float32), "registered")
    try:
        ids = torch.empty(0, dtype=torch.int64, device="cuda")
        assert ops.gather_rows(placed.table, ids).shape == (0, 4)
        assert ops.gather_rows(placed.table, ids, sort_ids=True).shape == (0, 4)
    finally:
        placed.close()
    empty_cols = torch.empty(10, 0).cuda()
    assert ops.gather_rows(empty_cols, torch.tensor([1, 2], device="cuda")).shape == (2, 0)


def test_runs_on_the_current_non_default_stream() -> None:
    # The ids are written on a side stream after a long sleep; a gather issued on that stream must see them.
    # A kernel launched on any other stream would read the zeros that are there before.
    host = random_table(4096, 64, torch.float32, seed=6)
    placed = Placed(host, "registered")
    try:
        real = random_ids(4096, 10_000, seed=7).cuda()
        ids = torch.zeros_like(real)
        out = poisoned((10_000, 64), torch.float32)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles
            ids.copy_(real)
            ops.gather_rows(placed.table, ids, out, sort_ids=True)
        assert bitwise_equal(out, host[real.cpu()])
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)
            ids.copy_(real.flip(0))
            ops.gather_rows(placed.table, ids, out)
        assert bitwise_equal(out, host[real.flip(0).cpu()])
    finally:
        placed.close()


@pytest.mark.parametrize("bad", [-1, 997, 2**40])
@pytest.mark.parametrize("sort_ids", [False, True])
def test_bad_id_raises_naming_it_and_the_next_call_works(bad: int, sort_ids: bool) -> None:
    host = random_table(997, 16, torch.float32, seed=8)
    placed = Placed(host, "registered")
    try:
        ids = random_ids(997, 5000, seed=9)
        ids[3210] = bad
        with pytest.raises(IndexError, match=rf"`ids`.*{bad}.*position 3210"):
            ops.gather_rows(placed.table, ids.cuda(), sort_ids=sort_ids)
        with pytest.raises(IndexError, match=rf"`ids`.*{bad}.*position 3210"):
            ops.gather_rows(placed.table, ids.cuda())
        good = random_ids(997, 5000, seed=10).cuda()
        assert bitwise_equal(ops.gather_rows(placed.table, good, sort_ids=sort_ids), host[good.cpu()])
    finally:
        placed.close()


def test_unregistered_host_table_raises_value_error() -> None:
    table = random_table(100, 8, torch.float32)  # ordinary pageable memory
    with pytest.raises(ValueError, match="`table`.*not pinned and mapped"):
        ops.gather_rows(table, torch.tensor([1, 2], device="cuda"))


def test_device_and_shape_errors_name_the_argument() -> None:
    placed = Placed(random_table(100, 8, torch.float32), "registered")
    try:
        ids = torch.tensor([1, 2], device="cuda")
        with pytest.raises(ValueError, match="`out`"):
            ops.gather_rows(placed.table, ids, torch.empty(2, 8))  # CPU out with CUDA ids
        with pytest.raises(ValueError, match="`out`"):
            ops.gather_rows(placed.table, ids, torch.empty(3, 8, device="cuda"))
        with pytest.raises(TypeError, match="`ids`"):
            ops.gather_rows(placed.table, ids.float())
        with pytest.raises(ValueError, match="cache_slot"):
            ops.gather_rows(placed.table, ids, cache_slot=torch.full((100,), -1, dtype=torch.int32, device="cuda"))
    finally:
        placed.close()


def test_hot_row_cache_serves_cached_rows_from_the_gpu() -> None:
    from lightning_zerocopy.gather import CudaFeatureTable

    host = random_table(2000, 33, torch.bfloat16, seed=11)
    hot = torch.randperm(2000, generator=torch.Generator().manual_seed(12))[:300]
    with CudaFeatureTable(exclusive_host_copy(host), mode="direct", hot_rows=hot) as table:
        ids = random_ids(2000, 6000, seed=13).cuda()
        assert bitwise_equal(table.gather(ids), host[ids.cpu()])
        # Change the host copy: cached rows still come from the GPU copy, the others from host memory.
        table.table.add_(1)
        changed = host + 1
        expected = changed[ids.cpu()]
        is_hot = torch.isin(ids.cpu(), hot)
        expected[is_hot] = host[ids.cpu()][is_hot]
        assert is_hot.any() and (~is_hot).any()
        for mode in ("direct", "sorted"):
            table.mode = mode
            assert bitwise_equal(table.gather(ids), expected), mode
        with pytest.raises(IndexError, match="`ids`"):
            table.gather(torch.tensor([5, 2000], device="cuda"))


@pytest.mark.parametrize("sort_ids", [False, True])
def test_hot_row_cache_with_a_bad_id_names_its_batch_position(sort_ids: bool) -> None:
    host = random_table(997, 16, torch.float32, seed=14)
    placed = Placed(host, "registered")
    try:
        hot = torch.arange(0, 997, 3)
        slot = torch.full((997,), -1, dtype=torch.int32)
        slot[hot] = torch.arange(hot.numel(), dtype=torch.int32)
        cache = host[hot].cuda()
        ids = random_ids(997, 5000, seed=15)
        expected = host[ids]
        good = ops.gather_rows(placed.table, ids.cuda(), sort_ids=sort_ids, cache_slot=slot.cuda(), cache=cache)
        assert bitwise_equal(good, expected)
        ids[4321] = 997
        with pytest.raises(IndexError, match=r"`ids`.*997.*position 4321"):
            ops.gather_rows(placed.table, ids.cuda(), sort_ids=sort_ids, cache_slot=slot.cuda(), cache=cache)
    finally:
        placed.close()


def test_feature_table_auto_mode_measures_then_chooses() -> None:
    from lightning_zerocopy.gather import CudaFeatureTable

    host = random_table(50_000, 64, torch.float16, seed=14)
    with CudaFeatureTable(exclusive_host_copy(host), mode="auto", trial_calls=2) as table:
        assert table.chosen_mode is None
        buffer = poisoned((30_000, 64), torch.float16)
        torch.cuda.synchronize()  # the poison fill ran on the default stream; gathers run on a side stream
        stream = torch.cuda.Stream()
        for call in range(6):
            ids = random_ids(50_000, 20_000 + call, seed=20 + call).cuda()
            out = table.gather(ids, out=buffer[: ids.numel()], stream=stream)
            assert out.data_ptr() == buffer.data_ptr()
            assert bitwise_equal(out, host[ids.cpu()])
        assert table.chosen_mode in ("direct", "sorted")
        times = table.trial_times
        assert len(times["direct"]) == 2 and len(times["sorted"]) == 2 and all(t > 0 for v in times.values() for t in v)


def test_register_host_tensor_pins_in_chunks_and_unregisters() -> None:
    from lightning_zerocopy.graph import register_host_tensor

    table = exclusive_host_copy(random_table(3000, 700, torch.float32))  # 8.4 MB, several 1 MiB chunks
    reg = register_host_tensor(table, chunk_bytes=1 << 20)
    assert len(reg.chunks) >= 8 and table.is_pinned()
    ids = random_ids(3000, 100).cuda()
    assert bitwise_equal(ops.gather_rows(table, ids), table[ids.cpu()])
    reg.close()
    reg.close()  # idempotent
    assert not table.is_pinned()
    with pytest.raises(ValueError, match="not pinned and mapped"):
        ops.gather_rows(table, ids)
    with pytest.raises(ValueError, match="contiguous"):
        register_host_tensor(table.t())


def test_most_frequent_neighbors() -> None:
    from lightning_zerocopy.gather import most_frequent_neighbors

    from lightning_zerocopy.gather import frequency_order

    indices = torch.tensor([5, 1, 5, 2, 5, 1, 0], dtype=torch.int32)
    assert most_frequent_neighbors(indices, 7, 2).tolist() == [5, 1]
    assert frequency_order(indices, 7).tolist() == [5, 1, 0, 2, 3, 4, 6]  # by frequency, ties by id


def test_opcheck_cuda() -> None:
    placed = Placed(random_table(300, 12, torch.float32), "cuda")
    ids = random_ids(300, 50).cuda()
    out = torch.empty(50, 12, device="cuda")
    slot = torch.full((300,), -1, dtype=torch.int32, device="cuda")
    slot[:10] = torch.arange(10, dtype=torch.int32, device="cuda")
    cache = placed.table[:10].clone()
    for args in ((placed.table, ids, out, False, None, None), (placed.table, ids, out, True, slot, cache)):
        opcheck(torch.ops.zerocopy.gather_rows_into.default, args)
    opcheck(torch.ops.zerocopy.gather_rows_into.default, (placed.table, ids, out))


def test_feature_table_accepts_a_host_feature_table() -> None:
    from lightning_zerocopy.gather import CudaFeatureTable, HostFeatureTable

    host = random_table(3000, 24, torch.float16, seed=30)
    with CudaFeatureTable(HostFeatureTable(exclusive_host_copy(host)), mode="direct") as table:
        ids = random_ids(3000, 700, seed=31).cuda()
        assert bitwise_equal(table.gather(ids), host[ids.cpu()])
        assert table.chosen_mode == "direct" and table.row_bytes == 48


def test_feature_table_staged_reads_through_host_threads_and_one_copy() -> None:
    from lightning_zerocopy.gather import CudaFeatureTable

    host = random_table(4000, 33, torch.bfloat16, seed=40)
    hot = torch.randperm(4000, generator=torch.Generator().manual_seed(41))[:500]
    with CudaFeatureTable(exclusive_host_copy(host), mode="staged", hot_rows=hot) as table:
        assert table.chosen_mode == "staged"
        stream = torch.cuda.Stream()
        buffer = poisoned((9000, 33), torch.bfloat16)
        torch.cuda.synchronize()
        for call in range(3):  # the staging buffer is reused: each batch must still be its own
            ids = random_ids(4000, 6000 + 1000 * call, seed=42 + call).cuda()
            out = table.gather(ids, out=buffer[: ids.numel()], stream=stream)
            assert out.data_ptr() == buffer.data_ptr() and bitwise_equal(out, host[ids.cpu()])
        table.table.add_(1)  # cached rows still come from the GPU copy, the others from host memory
        ids = random_ids(4000, 3000, seed=45).cuda()
        expected = (host + 1)[ids.cpu()]
        is_hot = torch.isin(ids.cpu(), hot)
        expected[is_hot] = host[ids.cpu()][is_hot]
        assert is_hot.any() and (~is_hot).any() and bitwise_equal(table.gather(ids), expected)
        with pytest.raises(IndexError, match=r"ids\[1\] = 4000 is outside"):
            table.gather(torch.tensor([5, 4000], device="cuda"))
    on_gpu = random_table(100, 8, torch.float32, seed=46).cuda()
    with CudaFeatureTable(on_gpu, mode="staged") as table:  # nothing to stage: read in place
        ids = random_ids(100, 50, seed=47).cuda()
        assert table.chosen_mode == "direct" and bitwise_equal(table.gather(ids), on_gpu[ids])
