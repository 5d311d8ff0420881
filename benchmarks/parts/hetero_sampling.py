"""Where does a heterogeneous batch's sampling time go? Per hop: the fused kernel calls, the per-type deduplication.

The heterogeneous sampler (:mod:`lightning_zerocopy.sampling.hetero`) makes one call of the one-hop picking kernel per
hop over the CSC of every edge type (one per distinct fanout of the hop), splits the picks by edge type, then
deduplicates each node type's picks (:func:`~lightning_zerocopy.sampling.hetero.dedup_by_type`: one call of the op
``dedup_typed_keys`` over every node type, a hash table). This benchmark samples training batches of the heterogeneous
benchmark's graph (``benchmarks.end_to_end.hetero`` presets, the same cache) through the DataModule's own builder and
reports the kernel calls per batch and, per hop: the frontier, the candidates picked, the new nodes kept, the
milliseconds of the hop (``hop_ms``: the draw, i.e. kernel calls + split by edge type, plus the deduplication), of
its kernel calls and of its deduplication; beside them, two bounds measured on the same device: a
``torch.sort`` of as many int64 keys as the hop's candidates (the yardstick the deduplication is held to) and the
whole batch un-instrumented (the sections are timed with a device sync on each side, which removes the overlap of
host and device work, so their sum exceeds the plain batch time).

Run it on the whole GPU to see the kernel time alone; the pipeline's worker runs the same code under an MPS share
(``--worker-sm-percent`` of ``benchmarks.end_to_end.hetero``), which scales the device parts.

Example::

    python -m benchmarks.parts.hetero_sampling --preset mag --cache-dir /tmp/lzc --num-neighbors 10,10,10 \\
        --out results/hetero_sampling.json
    python -m benchmarks.parts.hetero_sampling --preset ci --placement cpu --batches 3   # a tiny CPU run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:  # run from a checkout without installing the package
    sys.path.append(REPO_ROOT)

from benchmarks.common.meta import machine_info  # noqa: E402
from benchmarks.common.results import write_json  # noqa: E402


@dataclass
class HopFigures:
    """One hop of one batch: sizes and the time of its two sections (milliseconds, device-synced)."""

    frontier: int = 0  # target nodes the hop's kernel calls were given (over every edge type)
    candidates: int = 0  # neighbors picked (before deduplication)
    new_nodes: int = 0  # nodes the hop added (after deduplication, over every node type)
    kernel_calls: int = 0
    kernel_ms: float = 0.0
    draw_ms: float = 0.0  # the kernel calls, the split of their picks by edge type and the id maps
    dedup_calls: int = 0
    dedup_ms: float = 0.0

    @property
    def hop_ms(self) -> float:
        return self.draw_ms + self.dedup_ms


@dataclass
class BatchFigures:
    """One batch: its hops and its time without the section syncs."""

    hops: list[HopFigures] = field(default_factory=list)
    plain_ms: float = 0.0


class SectionClock:
    """Times callables with a device sync on either side and files the time under the hop being sampled."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.batch: Optional[BatchFigures] = None
        self.current_hop = 0

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, call: Callable[[], Any]) -> tuple[Any, float]:
        self.sync()
        start = time.perf_counter()
        out = call()
        self.sync()
        return out, (time.perf_counter() - start) * 1e3

    def hop(self, index: int) -> HopFigures:
        assert self.batch is not None
        while len(self.batch.hops) <= index:
            self.batch.hops.append(HopFigures())
        return self.batch.hops[index]


@contextmanager
def instrumented(clock: SectionClock) -> Iterator[None]:
    """Wrap the typed sampler's draws (``hetero._draw_hop``, which names its hop), their kernel calls and its
    deduplications with ``clock`` for the ``with`` block."""
    from lightning_zerocopy.sampling import hetero
    from lightning_zerocopy.sampling.neighbor_sampler import CSCKernel

    plain_draw, plain_call, plain_dedup = hetero._draw_hop, CSCKernel._call, hetero.dedup_by_type

    def draw(sampler: Any, n_id: Any, frontier: Any, hop: int, seed: int) -> Any:
        if clock.batch is None:
            return plain_draw(sampler, n_id, frontier, hop, seed)
        clock.current_hop = hop
        drawn, ms = clock.timed(lambda: plain_draw(sampler, n_id, frontier, hop, seed))
        clock.hop(hop).draw_ms += ms
        return drawn

    def call(self: Any, op: Any, seeds: torch.Tensor, *args: Any) -> Any:  # every kernel call of a CSCKernel
        if clock.batch is None:
            return plain_call(self, op, seeds, *args)
        (out, e_id), ms = clock.timed(lambda: plain_call(self, op, seeds, *args))
        figures = clock.hop(clock.current_hop)
        figures.frontier += int(seeds.numel())
        figures.candidates += int(out.edge_pos.numel())
        figures.kernel_calls += 1
        figures.kernel_ms += ms
        return out, e_id

    def dedup(n_id: Any, picked: Any, node_keyed: bool) -> Any:
        if clock.batch is None:
            return plain_dedup(n_id, picked, node_keyed)
        out, ms = clock.timed(lambda: plain_dedup(n_id, picked, node_keyed))
        figures = clock.hop(clock.current_hop)
        figures.new_nodes += sum(int(new.numel()) for new, _ in out.values())
        figures.dedup_calls += 1
        figures.dedup_ms += ms
        return out

    hetero._draw_hop, CSCKernel._call, hetero.dedup_by_type = draw, call, dedup  # type: ignore[method-assign]
    try:
        yield
    finally:
        hetero._draw_hop, CSCKernel._call, hetero.dedup_by_type = plain_draw, plain_call, plain_dedup  # type: ignore[method-assign]


def sort_bound_ms(count: int, device: torch.device, repeats: int = 5) -> float:
    """The median milliseconds of ``torch.sort`` over ``count`` random int64 keys on ``device``."""
    keys = torch.randint(0, 1 << 40, (max(count, 1),), device=device)
    clock = SectionClock(device)
    return statistics.median(clock.timed(lambda: torch.sort(keys))[1] for _ in range(repeats))


def parse_args(argv: Optional[list[str]] = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This benchmark's arguments, and the heterogeneous benchmark's (graph preset and fanouts) they imply."""
    from benchmarks.end_to_end.hetero.__main__ import parse_args as hetero_args

    p = argparse.ArgumentParser(prog="python -m benchmarks.parts.hetero_sampling", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="mag", help="benchmarks.end_to_end.hetero's graph preset (ci, mag, mag10x)")
    p.add_argument("--cache-dir", help="dataset cache root (the heterogeneous benchmark's)")
    p.add_argument("--num-neighbors", default="10,10,10", help="fanouts per hop, the same for every edge type")
    p.add_argument("--batch-size", type=int, help="seed papers per batch (default: the preset's)")
    p.add_argument("--placement", choices=("gpu", "uva", "cpu"), default="gpu", help="the sampler's placement")
    p.add_argument("--batches", type=int, default=20, help="timed batches")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)
    if args.placement != "cpu" and not torch.cuda.is_available():
        p.error(f"--placement {args.placement} needs a CUDA device; use --placement cpu on this machine")
    forwarded = ["--preset", args.preset, "--num-neighbors", args.num_neighbors]
    forwarded += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    forwarded += ["--batch-size", str(args.batch_size)] if args.batch_size else []
    return args, hetero_args(forwarded)


def summarize(batches: list[BatchFigures], sort_ms: list[float]) -> dict[str, Any]:
    """Per hop medians over the timed batches, and the batch medians."""
    hops = []
    for index in range(max(len(b.hops) for b in batches)):
        rows = [b.hops[index] for b in batches if len(b.hops) > index]
        hop = {name: statistics.median(getattr(r, name) for r in rows) for name in asdict(rows[0])}
        hop["hop_ms"] = statistics.median(r.hop_ms for r in rows)
        hop["sort_bound_ms"] = sort_ms[index]
        hops.append(hop)
    return {
        "hops": hops,
        "plain_ms_median": statistics.median(b.plain_ms for b in batches),
        "kernel_calls_per_batch": statistics.median(sum(h.kernel_calls for h in b.hops) for b in batches),
        "kernel_ms_median": statistics.median(sum(h.kernel_ms for h in b.hops) for b in batches),
        "dedup_ms_median": statistics.median(sum(h.dedup_ms for h in b.hops) for b in batches),
    }


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    from benchmarks.end_to_end.hetero.__main__ import dataset_kwargs
    from benchmarks.end_to_end.hetero.train import build_dataset
    from lightning_zerocopy import ZeroCopyHeteroDataModule

    args, graph = parse_args(argv)
    dataset = build_dataset(dataset_kwargs(graph))
    data = ZeroCopyHeteroDataModule(dataset, num_neighbors=list(graph.fanouts), batch_size=graph.batch_size,
                                    sampler_placement=args.placement)  # fmt: skip
    data.setup("fit")
    builder = data.builder("train").open(data.resources)
    plan = data.plan("train")
    device = builder.device
    clock = SectionClock(device)
    batches: list[BatchFigures] = []
    try:
        for step in range(args.warmup + args.batches):
            item = plan.item(0, step)
            _, plain_ms = clock.timed(lambda: builder.sample_batch(item))
            clock.batch = BatchFigures(plain_ms=plain_ms)
            with instrumented(clock):
                builder.sample_batch(item)
            if step >= args.warmup:
                batches.append(clock.batch)
            clock.batch = None
    finally:
        builder.close()
        data.teardown("fit")
    hop_candidates = [statistics.median(b.hops[i].candidates for b in batches) for i in range(len(batches[0].hops))]
    report = {
        "meta": machine_info(REPO_ROOT, graph.cache_dir),
        "command": "python -m benchmarks.parts.hetero_sampling " + " ".join(argv if argv is not None else sys.argv[1:]),
        "graph": {"preset": args.preset, "fanouts": list(graph.fanouts), "batch_size": graph.batch_size},
        "placement": args.placement,
        "batches": args.batches,
        **summarize(batches, [sort_bound_ms(int(c), device) for c in hop_candidates]),
    }
    print(f"hetero sampling ({args.placement}, {args.preset}, fanouts {list(graph.fanouts)}, batch "
          f"{graph.batch_size}): {report['plain_ms_median']:.2f} ms a batch, "
          f"{report['kernel_calls_per_batch']:.0f} kernel calls (kernels {report['kernel_ms_median']:.2f}, "
          f"dedup {report['dedup_ms_median']:.2f}, synced)")  # fmt: skip
    for index, hop in enumerate(report["hops"]):
        print(f"  hop {index}: {hop['hop_ms']:.2f} ms; frontier {hop['frontier']:,.0f}, "
              f"picked {hop['candidates']:,.0f}, new {hop['new_nodes']:,.0f}; "
              f"{hop['kernel_calls']:.0f} kernel calls {hop['kernel_ms']:.2f} ms, "
              f"{hop['dedup_calls']:.0f} dedups {hop['dedup_ms']:.2f} ms (a sort of as many keys: "
              f"{hop['sort_bound_ms']:.2f} ms)")  # fmt: skip
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
