"""``zerocopy::dedup_typed_keys``: a typed sample's per-hop deduplication in one op.

Checked against the torch reference :func:`first_appearance` plus a ``bincount`` of the new keys' types on random
inputs (repeats, existing keys picked again, nothing new, no candidates, several types, ids near ``2**62 /
num_types``); bad input raises naming the argument; the CUDA kernel bitwise the CPU one (cuda-marked).
"""

from __future__ import annotations

import pytest
import torch
from helpers import opcheck

from lightning_zerocopy.sampling.typed_dedup import dedup_typed_keys, first_appearance


def _reference(existing: torch.Tensor, candidates: torch.Tensor, num_types: int):
    new, local = first_appearance(existing, candidates)
    return new, local, torch.bincount(new % num_types, minlength=num_types)


def _random_case(gen: torch.Generator, num_existing: int, num_candidates: int, num_types: int, pool: int,
                 base: int = 0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Unique existing keys and candidate keys (repeats, some existing) of ids in ``[base, base + pool)``."""
    ids = torch.arange(base, base + pool).repeat(num_types)
    keys = ids * num_types + torch.arange(num_types).repeat_interleave(pool)
    existing = keys[torch.randperm(keys.numel(), generator=gen)[:num_existing]]
    candidates = keys[torch.randint(0, keys.numel(), (num_candidates,), generator=gen)]
    return existing, candidates


def _assert_equal(got, want, case) -> None:
    assert got.type_counts.device.type == "cpu", case
    for name, g, w in zip(("new_keys", "local", "type_counts"), got, want):
        assert g.dtype == torch.int64 and torch.equal(g.cpu(), w.cpu()), (name, case)


def test_a_small_case_by_hand() -> None:
    got = dedup_typed_keys(torch.tensor([5, 3]), torch.tensor([7, 3, 9, 7, 5, 1]), 2)
    assert got.new_keys.tolist() == [7, 9, 1]
    assert got.local.tolist() == [2, 1, 3, 2, 0, 4]
    assert got.type_counts.tolist() == [0, 3]


@pytest.mark.parametrize("num_types", [1, 2, 5])
@pytest.mark.parametrize("large", [False, True], ids=["small_ids", "ids_near_2**62"])
def test_equals_first_appearance_and_bincount(num_types, large) -> None:
    gen = torch.Generator().manual_seed(num_types * 10 + int(large))
    base = (2**62) // num_types - 60 if large else 0
    for trial in range(150):
        pool = 1 + trial % 50
        existing, candidates = _random_case(gen, trial % 13, trial % 70, num_types, pool, base)
        _assert_equal(dedup_typed_keys(existing, candidates, num_types), _reference(existing, candidates, num_types),
                      trial)  # fmt: skip


@pytest.mark.parametrize(
    ("existing", "candidates", "new", "local"),
    [
        ([4, 9, 2], [2, 9, 2, 4], [], [2, 1, 2, 0]),  # nothing new
        ([4, 9, 2], [], [], []),  # no candidates
        ([], [8, 8, 8], [8], [0, 0, 0]),  # nothing existing
        ([], [], [], []),
    ],
)
def test_edge_cases(existing, candidates, new, local) -> None:
    got = dedup_typed_keys(torch.tensor(existing, dtype=torch.int64), torch.tensor(candidates, dtype=torch.int64), 3)
    assert got.new_keys.tolist() == new and got.local.tolist() == local
    assert got.type_counts.tolist() == torch.bincount(torch.tensor(new, dtype=torch.int64) % 3, minlength=3).tolist()


def test_many_types_and_many_keys() -> None:
    """2M candidates over 400k existing keys (the benchmark's shape) and more types than the CUDA kernel keeps in
    shared memory."""
    gen = torch.Generator().manual_seed(7)
    existing, candidates = _random_case(gen, 400_000, 2_000_000, 4, 250_000)
    _assert_equal(dedup_typed_keys(existing, candidates, 4), _reference(existing, candidates, 4), "large")
    existing, candidates = _random_case(gen, 3_000, 20_000, 3_000, 5)
    _assert_equal(dedup_typed_keys(existing, candidates, 3_000), _reference(existing, candidates, 3_000), "types")


@pytest.mark.parametrize(
    ("existing", "candidates", "num_types", "error", "match"),
    [
        ([3, -4, -1], [2], 2, IndexError, r"`existing_keys\[1\]` = -4 is negative"),
        ([3], [2, 5, -7, -1], 2, IndexError, r"`candidate_keys\[2\]` = -7 is negative"),
        ([3, 8, 5, 8, 3], [2], 2, ValueError, r"`existing_keys\[3\]` = 8 repeats an earlier key"),
        ([3], [2], 0, ValueError, r"`num_types` must be >= 1"),
        ([3], [2], -2, ValueError, r"`num_types` must be >= 1"),
    ],
)
def test_bad_input_raises_naming_the_argument(existing, candidates, num_types, error, match) -> None:
    with pytest.raises(error, match=match):
        dedup_typed_keys(torch.tensor(existing), torch.tensor(candidates), num_types)


@pytest.mark.parametrize(
    ("existing", "candidates", "error", "match"),
    [
        (torch.tensor([1.0]), torch.tensor([2]), TypeError, "`existing_keys` must be"),
        (torch.tensor([1]), torch.tensor([2], dtype=torch.int32), TypeError, "`candidate_keys` must be"),
        (torch.tensor([[1]]), torch.tensor([2]), ValueError, "`existing_keys` must be 1-D"),
        (torch.tensor([1]), torch.arange(6)[::2], ValueError, "`candidate_keys` must be contiguous"),
    ],
)
def test_bad_tensors_raise_naming_the_argument(existing, candidates, error, match) -> None:
    with pytest.raises(error, match=match):
        dedup_typed_keys(existing, candidates, 2)


def test_opcheck() -> None:
    existing, candidates = _random_case(torch.Generator().manual_seed(1), 20, 80, 3, 30)
    opcheck(torch.ops.zerocopy.dedup_typed_keys.default, (existing, candidates, 3))


# ---- the CUDA kernel ----


@pytest.mark.cuda
def test_cuda_bitwise_the_cpu_op_from_no_keys_to_millions() -> None:
    """Sizes up and down (the table's workspace grows and is reused: a stale table would show), hash collisions of a
    table kept at most half full, types in shared memory and beyond it, ids near 2**62 / num_types."""
    gen = torch.Generator().manual_seed(5)
    shapes = [(0, 0, 3, 10), (5, 0, 3, 10), (0, 1, 3, 10), (0, 700, 2, 40), (300, 5_000, 4, 2_000),
              (400_000, 2_000_000, 4, 250_000), (1_000, 3_000_000, 3, 900_000), (10, 100, 1, 60),
              (50_000, 200_000, 3_000, 60), (2_000, 10_000, 7, 1_000)]  # fmt: skip
    for num_existing, num_candidates, num_types, pool in shapes:
        for base in (0, (2**62) // num_types - pool):
            existing, candidates = _random_case(gen, num_existing, num_candidates, num_types, pool, base)
            cpu = dedup_typed_keys(existing, candidates, num_types)
            gpu = dedup_typed_keys(existing.cuda(), candidates.cuda(), num_types)
            assert gpu.new_keys.is_cuda and gpu.local.is_cuda
            _assert_equal(gpu, cpu, (num_existing, num_candidates, num_types, base))


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("existing", "candidates", "error", "match"),
    [
        ([3, -4, -1], [2], IndexError, r"`existing_keys\[1\]` = -4 is negative"),
        ([3], [2, 5, -7, -1], IndexError, r"`candidate_keys\[2\]` = -7 is negative"),
        ([3, 8, 5, 8, 3], [2], ValueError, r"`existing_keys\[3\]` = 8 repeats an earlier key"),
    ],
)
def test_cuda_bad_keys_raise_as_on_the_cpu(existing, candidates, error, match) -> None:
    with pytest.raises(error, match=match):
        dedup_typed_keys(torch.tensor(existing, device="cuda"), torch.tensor(candidates, device="cuda"), 2)
    with pytest.raises(ValueError, match="`existing_keys` must be on the device of `candidate_keys`"):
        dedup_typed_keys(torch.tensor(existing), torch.tensor(candidates, device="cuda"), 2)
