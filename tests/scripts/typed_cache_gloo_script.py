"""One rank of a two-rank gloo job deciding the cache over typed rows with ``RankCache`` (a stand-in heterogeneous
DataModule: a dict of feature tables; CPU ranks: decided, nothing placed), used by
``tests/cache/test_typed_cache_gloo.py``. ``python typed_cache_gloo_script.py OUT RANK WORLD_SIZE RANKING POLICY``
(``MASTER_ADDR``/``MASTER_PORT`` in the environment); writes ``OUT/rank<RANK>.json``: the plans' digest, the rows of
every type's plan in shard order and its bounds, the group and this rank's shard.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

from lightning_zerocopy.cache.setup import CacheOptions, RankCache, RankPlace

NUM_NODES = {"paper": 120, "author": 90, "institution": 12}
WIDTH = {"paper": 8, "institution": 32}  # author has no features
EDGES = [("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "rev_writes", "author"),
         ("institution", "employs", "author")]  # fmt: skip


def datamodule() -> SimpleNamespace:
    g = torch.Generator().manual_seed(0)  # the same host memory on every rank
    graphs = {et: SimpleNamespace(indices=torch.randint(0, NUM_NODES[et[0]], (300,), generator=g)) for et in EDGES}
    features = {t: SimpleNamespace(data=torch.randn(NUM_NODES[t], w, generator=g)) for t, w in WIDTH.items()}
    host = SimpleNamespace(tables=features, graphs=graphs, num_nodes=dict(NUM_NODES))
    return SimpleNamespace(hot_rows=0, uses_zerocopy_gather=False, resources=SimpleNamespace(host=host),
                           set_feature_cache=lambda spec: None)  # fmt: skip


def presample(rank: int):
    def counts(num_rows: dict) -> dict:
        g = torch.Generator().manual_seed(100 + rank)  # each rank's own batches
        return {t: torch.randint(0, 3, (2, n), generator=g) for t, n in num_rows.items()}

    return counts


def main(out: str, rank: int, world_size: int, ranking: str, policy: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        peer = [[True] * world_size for _ in range(world_size)]
        cache = RankCache(CacheOptions.parse("1KiB", ranking, policy, 4, peer))
        place = RankPlace(rank, world_size, 0, rank, torch.device("cpu"))
        assert cache.attach(datamodule(), place, lambda: 0, presample(rank), lambda name: dist.barrier()) is None
        d = cache.decision
        report = {"digest": d.digest, "group": list(d.group), "shard_index": d.shard_index,
                  "rows": {t: p.rows.tolist() for t, p in d.plans.items()},
                  "bounds": {t: list(p.bounds) for t, p in d.plans.items()},
                  "bytes_per_gpu": d.bytes_per_gpu, "summary": d.summary()}  # fmt: skip
        with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(report, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
