"""What does a recipe's training loop wait for? Runs ``lightning-zerocopy fit`` on a recipe once per
PipelineCallback variant (added where the recipe has none) and summarizes DataTelemetry's per-step figures from a CSV log.

For each variant (``mode:worker_sm_percent:mps``) the recipe is copied with the callback's ``mode``, ``mps`` and
``worker_sm_percent`` replaced, run for ``--steps`` steps without validation, and the logged steps from
``--skip`` on are read: the GPU stall fraction (the GPU's idle gap between steps, or the host's wait on the
CPU), the step time, the host's wait and the producer's batch build time. The first variant also pays for
building the dataset cache.

    python -m benchmarks.parts.recipe_telemetry --recipe recipes/gpu_zerocopy.yaml --variants auto:10:true,in_process:10:false

Measured with it: docs/BENCHMARK_NOTES.md ("The GPU recipe end to end").
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.append(str(REPO_ROOT))

from benchmarks.common.results import write_json  # noqa: E402


def _variant_recipe(recipe: dict, mode: str, percent: int, mps: bool) -> dict:
    trainer = recipe.setdefault("trainer", {})
    callbacks = trainer.get("callbacks") or []
    trainer["callbacks"] = callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    pipeline = [c for c in callbacks if isinstance(c, dict) and str(c.get("class_path", "")).endswith("PipelineCallback")]
    if not pipeline:  # a recipe without the callback: add it
        pipeline = [{"class_path": "lightning_zerocopy.callbacks.PipelineCallback"}]
        callbacks.insert(0, pipeline[0])
    if not any(str(c.get("class_path", "")).endswith("DataTelemetry") for c in callbacks if isinstance(c, dict)):
        callbacks.append({"class_path": "lightning_zerocopy.callbacks.DataTelemetry"})
    pipeline[0].setdefault("init_args", {}).update(mode=mode, worker_sm_percent=percent, mps=mps)
    return recipe


def _summarize(metrics_csv: Path, skip: int) -> dict:
    with open(metrics_csv) as f:
        rows = [r for r in csv.DictReader(f) if r.get("data/stall_frac_step") and int(r["step"]) >= skip]
    if not rows:
        return {"logged_steps": 0}

    def median(key: str) -> float:
        return statistics.median(float(r[key]) for r in rows if r.get(key))

    out = {"logged_steps": len(rows), "stall_frac": statistics.mean(float(r["data/stall_frac_step"]) for r in rows),
           "step_ms": median("data/step_ms_step"), "wait_ms": median("data/wait_ms_step")}  # fmt: skip
    out["steps_per_s"] = 1e3 / out["step_ms"]
    if rows[0].get("data/build_ms_step"):
        out["build_ms"] = median("data/build_ms_step")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=str(REPO_ROOT / "recipes" / "gpu_zerocopy.yaml"))
    p.add_argument("--variants", default="auto:10:true,in_process:10:false", help="mode:worker_sm_percent:mps,...")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--skip", type=int, default=150, help="logged steps before this one are warm-up")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per variant")
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args()

    results = []
    for variant in args.variants.split(","):
        mode, percent, mps = variant.split(":")
        with tempfile.TemporaryDirectory(prefix="lzc-recipe-") as tmp:
            recipe = _variant_recipe(yaml.safe_load(Path(args.recipe).read_text()), mode, int(percent), mps == "true")
            config = Path(tmp, "recipe.yaml")
            config.write_text(yaml.safe_dump(recipe))
            logger = {"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": tmp, "name": "log"}}
            command = [sys.executable, "-m", "lightning_zerocopy", "fit", "--config", str(config),
                       f"--trainer.max_steps={args.steps}", "--trainer.max_epochs=-1", "--trainer.limit_val_batches=0",
                       f"--trainer.log_every_n_steps={args.log_every}", "--trainer.enable_progress_bar=false",
                       "--trainer.enable_model_summary=false", "--trainer.enable_checkpointing=false",
                       f"--trainer.logger={json.dumps(logger)}"]  # fmt: skip
            start = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=tmp)
            result = {"variant": variant, "exit_code": proc.returncode, "wall_s": time.perf_counter() - start}
            if proc.returncode != 0:
                result["stderr_tail"] = proc.stderr[-2000:]
            else:
                result.update(_summarize(Path(tmp, "log", "version_0", "metrics.csv"), args.skip))
                result["warnings"] = sorted({line.split(":")[2].strip() for line in proc.stderr.splitlines()
                                             if "Warning:" in line and line.count(":") >= 3})[:5]  # fmt: skip
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.out:
        write_json(args.out, {"recipe": args.recipe, "steps": args.steps, "results": results})
    print(f"\n{'variant':<24}{'stall':>8}{'ms/step':>10}{'host wait':>11}{'build ms':>10}")
    for r in results:
        if r.get("logged_steps"):
            print(f"{r['variant']:<24}{r['stall_frac']:>8.1%}{r['step_ms']:>10.1f}{r['wait_ms']:>11.1f}{r.get('build_ms', float('nan')):>10.1f}")
        else:
            print(f"{r['variant']:<24} failed (exit {r['exit_code']}) or logged nothing")


if __name__ == "__main__":
    main()
