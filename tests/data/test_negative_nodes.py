"""zerocopy::negative_nodes against a pure-Python reference of the counter-based stream, plus bad inputs and opcheck.

The reference re-implements rng::stream_key / Stream.below / the inverse-CDF draw with Python integers and floats,
so a change to the kernel's stream (which would change every seeded run's negatives) fails here.
"""

from __future__ import annotations

import bisect

import pytest
import torch

from lightning_zerocopy import ops

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
NEG_HOP = 0x6E65670000000000


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def stream_key(seed: int, hop: int, position: int) -> int:
    inner = mix64((mix64(seed) + (hop + 1) * GOLDEN) & M64)
    return mix64(inner ^ ((position * 0xD1B54A32D192ED03) & M64))


class Stream:
    def __init__(self, key: int) -> None:
        self.state = key

    def next(self) -> int:
        self.state = (self.state + GOLDEN) & M64
        return mix64(self.state)

    def below(self, bound: int) -> int:
        x = self.next()
        low = (x * bound) & M64
        if low < bound:
            threshold = ((1 << 64) - bound) % bound
            while low < threshold:
                x = self.next()
                low = (x * bound) & M64
        return (x * bound) >> 64


def reference(positions, num_nodes, seed, endpoint, cum_weight=None):
    out = []
    cum = None if cum_weight is None else cum_weight.tolist()
    for p in positions.tolist():
        s = Stream(stream_key(seed, NEG_HOP + endpoint, p & M64))
        if cum is None:
            out.append(s.below(num_nodes))
        else:
            u = (s.next() >> 11) * 2.0**-53
            out.append(min(bisect.bisect_right(cum, u * cum[-1]), num_nodes - 1))
    return torch.tensor(out, dtype=torch.int64)


@pytest.mark.parametrize("num_nodes", [1, 7, 1000, 3_000_017])
@pytest.mark.parametrize("endpoint", [0, 1])
def test_uniform_matches_reference(num_nodes, endpoint):
    seed = 0x1234_5678_9ABC_DEF
    positions = torch.randperm(4000)[:500]  # any counters, in any order
    out = ops.negative_nodes(positions, num_nodes, seed, endpoint)
    assert torch.equal(out, reference(positions, num_nodes, seed, endpoint))
    assert int(out.min()) >= 0 and int(out.max()) < num_nodes


def test_weighted_matches_reference_and_skips_zero_weights():
    g = torch.Generator().manual_seed(3)
    weight = torch.rand(200, generator=g, dtype=torch.float64)
    weight[::3] = 0.0  # never drawn
    cum = torch.cumsum(weight, 0)
    positions = torch.arange(5000)
    out = ops.negative_nodes(positions, 200, seed=99, endpoint=1, cum_weight=cum)
    assert torch.equal(out, reference(positions, 200, 99, 1, cum))
    assert not bool(torch.isin(out, torch.arange(0, 200, 3)).any())


def test_weighted_distribution_follows_the_weights():
    weight = torch.tensor([1.0, 0.0, 3.0, 6.0], dtype=torch.float64)
    out = ops.negative_nodes(torch.arange(200_000), 4, seed=5, endpoint=0, cum_weight=torch.cumsum(weight, 0))
    freq = torch.bincount(out, minlength=4).double() / out.numel()
    assert torch.allclose(freq, weight / weight.sum(), atol=0.01)


def test_uniform_distribution_and_independent_streams():
    out = ops.negative_nodes(torch.arange(100_000), 10, seed=1, endpoint=0)
    freq = torch.bincount(out, minlength=10).double() / out.numel()
    assert torch.allclose(freq, torch.full((10,), 0.1, dtype=torch.float64), atol=0.01)
    other = ops.negative_nodes(torch.arange(100_000), 10, seed=1, endpoint=1)
    assert (out == other).double().mean() < 0.2  # source and destination streams differ
    assert not torch.equal(out, ops.negative_nodes(torch.arange(100_000), 10, seed=2, endpoint=0))


def test_draw_depends_only_on_its_position():
    positions = torch.arange(1000)
    full = ops.negative_nodes(positions, 50, seed=7, endpoint=0)
    perm = torch.randperm(1000)
    assert torch.equal(ops.negative_nodes(positions[perm], 50, seed=7, endpoint=0), full[perm])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(positions=torch.arange(3, dtype=torch.int32)), TypeError, "positions"),
        (dict(positions=torch.arange(4).view(2, 2)), ValueError, "positions"),
        (dict(num_nodes=0), ValueError, "num_nodes"),
        (dict(endpoint=2), ValueError, "endpoint"),
        (dict(cum_weight=torch.ones(5)), TypeError, "cum_weight"),
        (dict(cum_weight=torch.ones(4, dtype=torch.float64)), ValueError, "cum_weight"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, error, match):
    args = dict(positions=torch.arange(3), num_nodes=5, seed=0, endpoint=0, cum_weight=None)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ops.negative_nodes(**args)


@pytest.mark.parametrize("weighted", [False, True])
def test_opcheck(weighted):
    cum = torch.cumsum(torch.rand(30, dtype=torch.float64) + 0.1, 0) if weighted else None
    torch.library.opcheck(torch.ops.zerocopy.negative_nodes.default, (torch.arange(40), 30, 11, 1, cum))


@pytest.mark.cuda
@pytest.mark.parametrize("weighted", [False, True])
def test_cuda_bitwise_equal_to_cpu(weighted):
    num_nodes = 100_003
    cum = torch.cumsum(torch.rand(num_nodes, dtype=torch.float64), 0) if weighted else None
    positions = torch.randperm(1_000_000)[:300_000]
    cpu = ops.negative_nodes(positions, num_nodes, 12345, 1, cum)
    gpu = ops.negative_nodes(positions.cuda(), num_nodes, 12345, 1, None if cum is None else cum.cuda())
    assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)
    torch.library.opcheck(
        torch.ops.zerocopy.negative_nodes.default, (positions[:100].cuda(), num_nodes, 1, 0, None if cum is None else cum.cuda())
    )
