"""Does the heavy GraphSAGE compute the same numbers as an MPS client with a share of the SMs as on the whole GPU?

Issue 40's share check (one H200, commit 70774ce) found the heavy model training at chance with the trainer at 80 % of
the SMs even with no worker and no data path (`model_only` under ``mps_launcher --worker-sm-percent 20``), while at
90 % and without MPS it learns. This script separates the model's arithmetic from everything else: one synthetic
batch of the heavy batch's shape (``benchmarks.common.heavy_batch``: 1024 seeds, fanouts [15, 10, 5], 100 features,
47 planted classes), drawn on the CPU from a fixed seed, so every process sees the same bytes. ``--dump DIR``: forward with a hook on every submodule,
the loss, backward, one Adam step, then ``--train-steps`` Adam steps over 4 such batches, all saved to
``DIR/<tag>.pt`` (the tensors) and printed as one JSON line (the losses, the SM count the process sees).
``--compare DIR --reference plain``: each other tag's tensors against the reference's, the first module whose
output leaves the tolerance named, a JSON report. Run each tag in its own process (the share is read when the CUDA
context is created; the repository root on ``PYTHONPATH``)::

    python scripts/diagnostics/mps_share_numerics.py --dump /tmp/num --tag plain
    nvidia-cuda-mps-control -d    # with CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY set for the daemon and clients
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=80 python scripts/diagnostics/mps_share_numerics.py --dump /tmp/num --tag share80
    echo quit | nvidia-cuda-mps-control
    python scripts/diagnostics/mps_share_numerics.py --compare /tmp/num --reference plain --out report.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common.heavy_batch import CLASSES, FANOUTS, FEATURES, HIDDEN, SEEDS, heavy_batch

def _checksum(t: torch.Tensor) -> dict[str, float]:
    d = t.detach().double()
    return {"sum": float(d.sum()), "abs": float(d.abs().sum()), "nan": int(torch.isnan(d).sum()),
            "inf": int(torch.isinf(d).sum()), "numel": d.numel()}  # fmt: skip


def dump(out_dir: Path, tag: str, precision: str, train_steps: int, device: str = "cuda") -> dict[str, Any]:
    from torch_geometric.nn.models import GraphSAGE  # the heavy model's net, without our package

    dev = torch.device(device)
    torch.manual_seed(0)
    model = GraphSAGE(FEATURES, HIDDEN, len(FANOUTS), CLASSES, dropout=0.0).to(dev)
    batches = [heavy_batch(s, dev) for s in range(4)]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    saved: dict[str, torch.Tensor] = {}
    order: list[str] = []

    def hook(name: str):
        def fn(_mod: Any, _inp: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor):
                key = f"fwd/{name}#{sum(k.startswith(f'fwd/{name}#') for k in saved)}"
                saved[key] = out.detach().float().cpu().clone()
                order.append(key)
        return fn

    handles = [m.register_forward_hook(hook(n or "net")) for n, m in model.named_modules()]

    def step(b: dict[str, Any]) -> torch.Tensor:
        with autocast:
            out = model(b["x"], b["edge_index"], num_sampled_nodes_per_hop=b["nodes"],
                        num_sampled_edges_per_hop=b["edges"])[:SEEDS]
            return F.cross_entropy(out.float(), b["y"])

    loss = step(batches[0])
    loss.backward()
    for h in handles:
        h.remove()
    saved["loss"] = loss.detach().cpu()
    for n, p in model.named_parameters():
        saved[f"grad/{n}"] = p.grad.detach().float().cpu().clone()
    opt.step()
    opt.zero_grad()
    for n, p in model.named_parameters():
        saved[f"param_after_step/{n}"] = p.detach().float().cpu().clone()
    losses = []
    for i in range(train_steps):
        loss = step(batches[i % len(batches)])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save({"tensors": saved, "order": order}, out_dir / f"{tag}.pt")
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count if dev.type == "cuda" else None
    summary = {"tag": tag, "precision": precision, "mps_percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
               "sm_count_seen": sm_count, "first_loss": float(saved["loss"]),
               "loss_every_25": losses[::25], "last_loss": losses[-1] if losses else None, "chance_loss": math.log(CLASSES),
               "checksums": {k: _checksum(v) for k, v in saved.items()}}  # fmt: skip
    (out_dir / f"{tag}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "checksums"}), flush=True)
    return summary


def compare(out_dir: Path, reference: str, rtol: float) -> dict[str, Any]:
    ref = torch.load(out_dir / f"{reference}.pt")
    report: dict[str, Any] = {"reference": reference, "rtol": rtol, "tags": {}}
    for path in sorted(out_dir.glob("*.pt")):
        tag = path.stem
        if tag == reference:
            continue
        other = torch.load(path)
        rows, first_bad = {}, None
        for key in ref["order"] + [k for k in ref["tensors"] if not k.startswith("fwd/")]:
            a, b = ref["tensors"][key], other["tensors"].get(key)
            if b is None or a.shape != b.shape:
                rows[key] = {"shape": [list(a.shape), None if b is None else list(b.shape)]}
                first_bad = first_bad or key
                continue
            err = float((a - b).norm() / a.norm().clamp_min(1e-30))
            rows[key] = {"rel_err": err, "nonfinite": int((~torch.isfinite(b)).sum())}
            if (err > rtol or rows[key]["nonfinite"]) and first_bad is None:
                first_bad = key
        report["tags"][tag] = {"first_outside_tolerance": first_bad, "rows": rows}
        print(f"{tag}: first outside rtol {rtol}: {first_bad}")
        for key, row in rows.items():
            print(f"  {key}: {row}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", type=Path)
    parser.add_argument("--tag", default="plain")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--compare", type=Path)
    parser.add_argument("--reference", default="plain")
    parser.add_argument("--rtol", type=float, default=0.05)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.dump:
        dump(args.dump, args.tag, args.precision, args.train_steps, args.device)
    if args.compare:
        report = compare(args.compare, args.reference, args.rtol)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
