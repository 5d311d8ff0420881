"""When does a process become a CUDA MPS client? One fresh process per variant, on a GPU machine with MPS.

A variant is a ``+``-joined list of steps run in order, for example ``torch+pyg+start``. Each step is one of:

``torch``, ``pl``, ``lzc``, ``pyg``, ``pygdata``, ``pipe``
    import torch / pytorch_lightning / lightning_zerocopy / torch_geometric / torch_geometric.data.Data /
    lightning_zerocopy.pipeline.mps
``count``, ``avail``
    ``torch.cuda.device_count()`` / ``torch.cuda.is_available()``
``sleep``
    wait 5 s
``trainer``
    construct ``pl.Trainer(accelerator="gpu")``
``start``
    start a private daemon (``mps.start_mps()``) and set ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50``
``cli``
    ``build_cli(run=False)`` on a small recipe with ``PipelineCallback(mps: true)``, then the callback's
    ``join_mps()`` (what its setup does); it starts the daemon itself, because its driver check is disabled here

After the steps, the process creates its CUDA context and times a bf16 8192² matmul. A client at a 50 % share
runs at about half the rate of a process outside MPS. Also reported: the driver's state after each step
(``cuDeviceGetCount`` and ``cuCtxGetCurrent`` return codes, where 3 means ``cuInit`` has not run), and
whether the daemon's control log names the process (``logged``). That log line is no proof of being a client.

    python -m benchmarks.parts.mps_clients start+torch torch+start torch+pyg+start torch+pyg+start+trainer cli

Measured with it: docs/BENCHMARK_NOTES.md ("When does a process become an MPS client?").
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RECIPE = """
trainer: {accelerator: gpu, devices: 1, max_epochs: 1, logger: false, enable_checkpointing: false,
  callbacks: [{class_path: lightning_zerocopy.callbacks.PipelineCallback, init_args: {mode: worker, mps: true}}]}
data: {class_path: lightning_zerocopy.ZeroCopyDataModule, init_args: {dataset: {class_path: lightning_zerocopy.datasets.SyntheticGraph,
  init_args: {num_nodes: 2000, cache_dir: /tmp/lzc-mps-clients-cache}}, fanouts: [5], batch_size: 64}}
model: {class_path: lightning_zerocopy.models.GraphSAGE, init_args: {hidden_channels: 16}}
"""


def driver_state() -> str:
    """Return codes of two driver calls that do not initialize it, or ``not-loaded``."""
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return "not-loaded"
    count, context = ctypes.c_int(-1), ctypes.c_void_p()
    return f"count_rc={lib.cuDeviceGetCount(ctypes.byref(count))} ctx_rc={lib.cuCtxGetCurrent(ctypes.byref(context))}"


def load_mps_module():
    """``lightning_zerocopy/pipeline/mps.py`` alone (standard library only: imports neither torch nor PyG)."""
    spec = importlib.util.spec_from_file_location("lzc_mps", os.path.join(REPO_ROOT, "lightning_zerocopy", "pipeline", "mps.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["lzc_mps"] = module
    spec.loader.exec_module(module)
    return module


def run_variant(variant: str) -> dict:
    sys.path.insert(0, REPO_ROOT)
    result: dict = {"variant": variant, "start": driver_state()}
    mps = None
    for step in variant.split("+"):
        if step == "torch":
            import torch  # noqa: F401
        elif step == "pl":
            import pytorch_lightning  # noqa: F401
        elif step == "lzc":
            import lightning_zerocopy  # noqa: F401
        elif step == "pyg":
            import torch_geometric  # noqa: F401
        elif step == "pygdata":
            from torch_geometric.data import Data  # noqa: F401
        elif step == "pipe":
            from lightning_zerocopy.pipeline import mps
        elif step == "count":
            import torch

            result["count"] = torch.cuda.device_count()
        elif step == "avail":
            import torch

            result["available"] = torch.cuda.is_available()
        elif step == "sleep":
            time.sleep(5)
        elif step == "trainer":
            import pytorch_lightning as pl

            pl.Trainer(accelerator="gpu", devices=1, logger=False)
        elif step == "cli":
            from lightning_zerocopy.cli import build_cli
            from lightning_zerocopy.pipeline import mps

            mps.cuda_driver_initialized = lambda: False  # let the callback start the daemon however late
            path = "/tmp/lzc-mps-clients-recipe.yaml"
            with open(path, "w") as f:
                f.write(RECIPE)
            cli = build_cli(["--config", path], run=False)
            joins = [c.join_mps for c in cli.trainer.callbacks if callable(getattr(c, "join_mps", None))]
            result["cli_daemon"] = any(join() is not None for join in joins)  # what setup does
        elif step == "start":
            mps = mps or load_mps_module()
            result["mps"] = mps.start_mps() is not None
            os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = "50"
        else:
            raise SystemExit(f"unknown step {step!r}")
        result[f"after_{step}"] = driver_state()
    import torch

    torch.zeros(1, device="cuda")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a @ a
    end.record()
    end.synchronize()
    result["tflops"] = round(2 * 8192**3 * 20 / (start.elapsed_time(end) / 1e3) / 1e12, 1)
    root = os.environ.get("LZC_MPS_ROOT")
    if root:
        time.sleep(0.3)
        with open(os.path.join(root, "log", "control.log")) as f:
            result["logged"] = f"NEW CLIENT {os.getpid()} " in f.read()
    return result


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--_child":
        print("RESULT " + json.dumps(run_variant(sys.argv[2])), flush=True)
        return
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    mps = load_mps_module()
    for variant in sys.argv[1:]:
        proc = subprocess.run([sys.executable, __file__, "--_child", variant], capture_output=True, text=True, timeout=180)
        lines = [line[len("RESULT "):] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        print(lines[0] if lines else json.dumps({"variant": variant, "error": proc.stderr[-2500:]}), flush=True)
        deadline = time.monotonic() + 30  # the supervisor stops this variant's daemon after the process exits
        while mps.mps_processes() and time.monotonic() < deadline:
            time.sleep(0.2)


if __name__ == "__main__":
    main()
