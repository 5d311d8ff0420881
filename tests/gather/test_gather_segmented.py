"""`zerocopy::gather_segmented_into` on the CPU against a pure-torch reference, bad input, and opcheck."""

from __future__ import annotations

import pytest
import torch

from lightning_zerocopy import ops
from lightning_zerocopy.cache.plan import CachePlan


def reference_gather(table, ids, location, slot_bits, segments):
    """Pure torch: each row from the segment/slot its lookup entry names, else from the table."""
    code = location[ids.long()].long()
    out = table[ids.long()].clone()
    shard = torch.where(code >= 0, code >> slot_bits, torch.full_like(code, -1))
    slot = code & ((1 << slot_bits) - 1)
    for s, seg in enumerate(segments):
        mask = shard == s
        out[mask] = seg[slot[mask]]
    return out


def make_case(
    num_rows=400, dim=12, num_shards=3, cached=150, n=1000, dtype=torch.float32, seed=0, id_dtype=torch.int64
):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(num_rows, dim, generator=g).to(dtype)
    plan = CachePlan.from_ranking(torch.randperm(num_rows, generator=g), num_rows, num_shards, num_rows=cached)
    # Segments hold different values than the table, so a row read from the wrong place shows.
    segments = [table[plan.shard_rows(s)] + 1000 * (s + 1) for s in range(num_shards)]
    ids = torch.randint(0, num_rows, (n,), generator=g).to(id_dtype)
    return table, plan, segments, ids


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("num_shards", [1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference(id_dtype, num_shards, dtype):
    table, plan, segments, ids = make_case(num_shards=num_shards, dtype=dtype, seed=num_shards, id_dtype=id_dtype)
    location = plan.build_location()
    counts = torch.zeros(num_shards + 1, dtype=torch.int64)
    out = ops.gather_segmented(table, ids, location, plan.slot_bits, segments, counts=counts)
    expected = reference_gather(table, ids, location, plan.slot_bits, segments)
    assert torch.equal(out, expected)
    # The segments hold shifted copies: shifting back gives table[ids] bitwise for fp32.
    code = location[ids.long()].long()
    shard = torch.where(code >= 0, code >> plan.slot_bits, torch.full_like(code, -1))
    for s in range(num_shards):
        assert int(counts[s]) == int((shard == s).sum())
    assert int(counts[-1]) == int((shard < 0).sum())
    assert int(counts.sum()) == ids.numel()


def test_int64_location_and_counts_accumulate():
    table, plan, segments, ids = make_case(num_shards=2)
    location = plan.build_location().long()  # the int64 layout works with any slot_bits up to 62
    shard, slot = location >> plan.slot_bits, location & ((1 << plan.slot_bits) - 1)
    location64 = torch.where(location >= 0, (shard << 40) | slot, location)
    counts = torch.zeros(3, dtype=torch.int64)
    out = torch.empty(ids.numel(), table.shape[1])
    ops.gather_segmented(table, ids, location64, 40, segments, out=out, counts=counts)
    ops.gather_segmented(table, ids, location64, 40, segments, out=out, counts=counts)
    assert torch.equal(out, reference_gather(table, ids, location64, 40, segments))
    assert int(counts.sum()) == 2 * ids.numel()


def test_sort_ids_gives_the_same_rows():
    table, plan, segments, ids = make_case(num_shards=2)
    location = plan.build_location()
    direct = ops.gather_segmented(table, ids, location, plan.slot_bits, segments)
    assert torch.equal(ops.gather_segmented(table, ids, location, plan.slot_bits, segments, sort_ids=True), direct)


def test_without_segments_is_a_plain_gather():
    table, _, _, ids = make_case()
    location = torch.full((table.shape[0],), -1, dtype=torch.int32)
    assert torch.equal(ops.gather_segmented(table, ids, location, 31, []), table[ids])


def test_empty_ids():
    table, plan, segments, _ = make_case()
    ids = torch.empty(0, dtype=torch.int64)
    out = ops.gather_segmented(table, ids, plan.build_location(), plan.slot_bits, segments)
    assert out.shape == (0, table.shape[1])


@pytest.mark.parametrize("bad", [-1, 400, 10**12])
def test_bad_id_raises_before_writing(bad):
    table, plan, segments, ids = make_case()
    ids[7] = bad
    out = torch.zeros(ids.numel(), table.shape[1])
    with pytest.raises(IndexError, match=rf"`ids` holds the (negative )?id {bad} at position 7"):
        ops.gather_segmented(table, ids, plan.build_location(), plan.slot_bits, segments, out=out)
    assert not out.any()


def test_corrupt_location_raises_without_reading():
    table, plan, segments, ids = make_case(num_shards=3)
    location = plan.build_location()
    row = int(ids[3])
    location[row] = (3 << plan.slot_bits) | 0  # segment 3 does not exist (2 shard bits)
    with pytest.raises(ValueError, match=rf"`location` sends row {row}"):
        ops.gather_segmented(table, ids, location, plan.slot_bits, segments)
    location = plan.build_location()
    location[row] = (1 << plan.slot_bits) | (segments[1].shape[0])  # one past the end of segment 1
    with pytest.raises(ValueError, match="segment 1"):
        ops.gather_segmented(table, ids, location, plan.slot_bits, segments)


def test_bad_arguments_name_them():
    table, plan, segments, ids = make_case(num_shards=2)
    location = plan.build_location()
    with pytest.raises(ValueError, match="`location` must have one entry per table row"):
        ops.gather_segmented(table, ids, location[:-1], plan.slot_bits, segments)
    with pytest.raises(ValueError, match="`slot_bits`"):
        ops.gather_segmented(table, ids, location, 32, segments)
    with pytest.raises(ValueError, match=r"`segments\[1\]`"):
        ops.gather_segmented(table, ids, location, plan.slot_bits, [segments[0], segments[1][:, :3].contiguous()])
    with pytest.raises(ValueError, match="`counts`"):
        ops.gather_segmented(table, ids, location, plan.slot_bits, segments, counts=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="at most 32"):
        ops.gather_segmented(table, ids, location, plan.slot_bits, [segments[0]] * 33)


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
def test_opcheck(id_dtype):
    table, plan, segments, ids = make_case(num_rows=60, dim=5, num_shards=2, cached=20, n=40, id_dtype=id_dtype)
    out = torch.empty(ids.numel(), 5)
    counts = torch.zeros(3, dtype=torch.int64)
    torch.library.opcheck(
        torch.ops.zerocopy.gather_segmented_into.default,
        (table, ids, out, plan.build_location(), plan.slot_bits, segments, counts),
    )
