"""GPU feature cache: fill_shard + open_feature_cache gather bitwise ``table[ids]`` (replicate, several shards on one
device, a GPU-resident table), CUDA IPC from a spawned process, hit counts, bad ids. Two-GPU tests (peer shards)
are marked ``two_gpus``, not ``cuda`` (a one-GPU box skips them; ``REQUIRE_TWO_GPUS=1`` fails a skipped one)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from lightning_zerocopy.cache import CachePlan, SegmentedCacheSpec, fill_shard, open_feature_cache

NUM_ROWS, DIM = 5000, 32


def _table(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(NUM_ROWS, DIM, generator=g).to(dtype)


def _plan(num_shards: int, cached: int = 1500, seed: int = 0) -> CachePlan:
    g = torch.Generator().manual_seed(seed + 100)
    return CachePlan.from_ranking(torch.randperm(NUM_ROWS, generator=g), NUM_ROWS, num_shards, num_rows=cached)


def _ids(n: int = 20000, seed: int = 1, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, NUM_ROWS, (n,), generator=g).to(dtype)


def _spec(plan: CachePlan, table: torch.Tensor, devices: list[int], policy: str):
    shards, handles = [], []
    for s, dev in enumerate(devices):
        shard, handle = fill_shard(plan, s, table, torch.device("cuda", dev))
        shards.append(shard)
        handles.append(handle)
    return shards, SegmentedCacheSpec(plan, tuple(handles), policy=policy)


def _expected_counts(plan: CachePlan, ids: torch.Tensor) -> tuple[int, int]:
    cached = torch.zeros(NUM_ROWS, dtype=torch.bool)
    cached[plan.rows] = True
    hits = int(cached[ids.long()].sum())
    return hits, ids.numel() - hits


@pytest.mark.cuda
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replicate_gathers_bitwise(id_dtype, dtype):
    table = _table(dtype=dtype)
    plan = _plan(1)
    shards, spec = _spec(plan, table, [0], "replicate")
    assert torch.equal(shards[0].cpu(), table[plan.rows])
    ids = _ids(dtype=id_dtype)
    with open_feature_cache(spec, table, "cuda:0") as cache:
        out = cache.gather(ids)
        assert out.device == torch.device("cuda", 0)
        assert torch.equal(out.cpu(), table[ids.long()])
        hits, misses = _expected_counts(plan, ids)
        assert cache.counts() == (hits, 0, misses)
        cache.gather(ids.cuda())
        assert cache.counts().total == 2 * ids.numel()
        cache.reset_counts()
        assert cache.counts().total == 0


@pytest.mark.cuda
@pytest.mark.parametrize("read_order", ["direct", "sorted", "auto", "staged"])
def test_read_orders_give_the_same_rows(read_order):
    table = _table(seed=3)
    plan = _plan(2, seed=3)
    _, spec = _spec(plan, table, [0, 0], "clique")
    with open_feature_cache(spec, table, "cuda:0", read_order=read_order) as cache:
        for seed in range(8):  # auto: 3 timed trials per order, then its choice
            ids = _ids(seed=seed)
            assert torch.equal(cache.gather(ids).cpu(), table[ids])
        assert cache.read_order in (("staged",) if read_order == "staged" else ("direct", "sorted"))
        if read_order != "auto":
            assert cache.read_order == read_order
        assert cache.counts().total == 8 * _ids().numel()
        hits, misses = _expected_counts(plan, _ids(seed=7))
        cache.reset_counts()
        cache.gather(_ids(seed=7))
        assert cache.counts() == (hits, 0, misses), "staged or not, rows are counted where they came from"


@pytest.mark.cuda
@pytest.mark.parametrize("read_order", ["direct", "sorted"])
def test_bad_location_entry_raises_value_error(read_order):
    table = _table(seed=4)
    plan = _plan(3, seed=4)
    _, spec = _spec(plan, table, [0, 0, 0], "clique")
    with open_feature_cache(spec, table, "cuda:0", read_order=read_order) as cache:
        ids = torch.randperm(NUM_ROWS, generator=torch.Generator().manual_seed(4))[:200]  # unique: one position
        cache.location[int(ids[17])] = 3 << plan.slot_bits  # a segment that does not exist
        with pytest.raises(ValueError, match=rf"of row {int(ids[17])} \(position 17 of `ids`\) names segment 3"):
            cache.gather(ids)


@pytest.mark.cuda
@pytest.mark.parametrize("num_shards", [2, 3, 4])
def test_several_shards_on_one_device(num_shards):
    table = _table(seed=num_shards)
    plan = _plan(num_shards, seed=num_shards)
    shards, spec = _spec(plan, table, [0] * num_shards, "clique")
    for s, shard in enumerate(shards):
        assert torch.equal(shard.cpu(), table[plan.shard_rows(s)])
    ids = _ids(seed=num_shards)
    with open_feature_cache(spec, table, 0) as cache:
        out = torch.full((ids.numel(), DIM), float("nan"), device="cuda:0")
        cache.gather(ids, out=out)
        assert torch.equal(out.cpu(), table[ids])
        hits, misses = _expected_counts(plan, ids)
        assert cache.counts() == (hits, 0, misses)
        assert 0 < hits < ids.numel()


@pytest.mark.cuda
def test_gpu_resident_table_and_empty_shard():
    table = _table(seed=5)
    plan = CachePlan.from_ranking(torch.arange(3), NUM_ROWS, 4)  # shard 3 holds nothing
    shards, spec = _spec(plan, table, [0] * 4, "clique")
    assert shards[3].shape == (0, DIM)
    ids = _ids(seed=5)
    with open_feature_cache(spec, table.cuda(), "cuda:0") as cache:
        assert torch.equal(cache.gather(ids).cpu(), table[ids])


@pytest.mark.cuda
def test_bad_ids_raise():
    table = _table()
    plan = _plan(2)
    _, spec = _spec(plan, table, [0, 0], "clique")
    with open_feature_cache(spec, table, "cuda:0") as cache:
        ids = _ids(100)
        ids[42] = NUM_ROWS
        with pytest.raises(IndexError, match=rf"`ids` holds the id {NUM_ROWS} at position 42"):
            cache.gather(ids)
        ids[42] = -3
        with pytest.raises(IndexError, match="`ids` holds the negative id -3 at position 42"):
            cache.gather(ids)
        assert torch.equal(cache.gather(_ids(100)).cpu(), table[_ids(100)])  # still usable
    with pytest.raises(RuntimeError, match="closed"):
        cache.gather(_ids(10))


def _open_in_child(spec, table, device, ids, queue) -> None:
    try:
        with open_feature_cache(spec, table, device) as cache:
            out = cache.gather(ids).cpu()
            segments_ok = all(
                torch.equal(seg.cpu(), table[spec.plan.shard_rows(s)]) for s, seg in enumerate(cache.segments)
            )
            # numpy pickles by value: a shared tensor would need this process alive until the parent unpickles it
            queue.put(("ok", out.numpy(), tuple(cache.counts()), segments_ok))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put(("error", repr(exc), None, None))


def _run_child(spec, table, device, ids):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_open_in_child, args=(spec, table, device, ids, queue))
    proc.start()
    try:
        result = queue.get(timeout=120)
    finally:
        proc.join(timeout=60)  # the shards stay alive here (owned by this process) until the child is done
    assert proc.exitcode == 0
    assert result[0] == "ok", result[1]
    return (torch.from_numpy(result[1]), *result[2:])


@pytest.mark.cuda
def test_ipc_open_in_a_spawned_process_on_the_same_gpu():
    table = _table(seed=7).share_memory_()
    plan = _plan(2, seed=7)
    shards, spec = _spec(plan, table, [0, 0], "clique")
    ids = _ids(seed=7)
    out, counts, segments_ok = _run_child(spec, table, "cuda:0", ids)
    assert segments_ok
    assert torch.equal(out, table[ids])
    hits, misses = _expected_counts(plan, ids)
    assert counts == (hits, 0, misses)
    del shards


two_gpus = pytest.mark.two_gpus


@two_gpus
def test_peer_shard_in_process():
    table = _table(seed=11)
    plan = _plan(2, seed=11)
    shards, spec = _spec(plan, table, [0, 1], "clique")
    ids = _ids(seed=11)
    with open_feature_cache(spec, table, "cuda:0") as cache:
        assert torch.equal(cache.gather(ids).cpu(), table[ids])
        local_rows = torch.zeros(NUM_ROWS, dtype=torch.bool)
        local_rows[plan.shard_rows(0)] = True
        peer_rows = torch.zeros(NUM_ROWS, dtype=torch.bool)
        peer_rows[plan.shard_rows(1)] = True
        local, peer, host = cache.counts()
        assert (local, peer) == (int(local_rows[ids].sum()), int(peer_rows[ids].sum()))
        assert host == ids.numel() - local - peer


@two_gpus
def test_peer_shard_over_ipc_from_a_spawned_process():
    table = _table(seed=13).share_memory_()
    plan = _plan(2, seed=13)
    shards, spec = _spec(plan, table, [0, 1], "clique")
    ids = _ids(seed=13)
    out, (local, peer, host), segments_ok = _run_child(spec, table, "cuda:1", ids)
    assert segments_ok and torch.equal(out, table[ids])
    assert local > 0 and peer > 0 and local + peer + host == ids.numel()
    del shards


_SHARD_EXIT_SCRIPT = """
import torch
import torch.multiprocessing as mp
from lightning_zerocopy.cache import CachePlan, fill_shard


def _open_twice(handle, queue):
    first, second = handle.open(), handle.open()  # the second open hits torch's cache of received storages
    queue.put(float(first.double().sum() + second.double().sum()))


if __name__ == "__main__":
    table = torch.randn(5000, 32)
    plan = CachePlan.from_ranking(torch.randperm(5000), 5000, 2, num_rows=1500)
    unopened, _ = fill_shard(plan, 0, table, "cuda:0")  # read by its exporter only (a single trainer rank)
    opened, handle = fill_shard(plan, 1, table, "cuda:0")  # opened twice by another process
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_open_twice, args=(handle, queue))
    child.start()
    total = queue.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0, child.exitcode
    assert abs(total - 2 * float(opened.double().sum())) < 1e-3 * max(1.0, abs(total)), total
    del unopened, opened  # the exporter frees its shards after every opener closed (the lifetime rule)
    torch.cuda.synchronize()
    print("SHARDS_FREED", flush=True)
"""


@pytest.mark.cuda
def test_exporter_frees_shards_opened_by_none_or_twice_and_prints_no_ipc_warning(tmp_path):
    """torch counts one consumer per CUDA IPC export; a shard read only by its exporter (counter stays 1) or opened
    twice (it wraps below zero) sat in torch's limbo and the exporter's exit printed "Producer process has been
    terminated before all shared CUDA tensors released" (the GPU recipe's fit and predict, issue 22)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "shard_exit.py"
    script.write_text(_SHARD_EXIT_SCRIPT)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "SHARDS_FREED" in proc.stdout
    assert "shared CUDA tensors released" not in proc.stderr, proc.stderr[-3000:]
