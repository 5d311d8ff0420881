"""Run on a GPU through the launcher: ``python -m lightning_zerocopy.pipeline.mps_launcher --worker-sm-percent 50 --
python3 mps_cuda_script.py 10`` (this script imports PyG, which initializes CUDA, so it cannot start MPS for
itself). Checks CUDA IPC of slots (and the slot hand-back) under MPS and measures the SM shares of the worker
(at the given percent and at 90 %) and of this process. Prints one JSON line; used by test_pipeline_cuda.py."""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests/ (helpers)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root (lightning_zerocopy)


from helpers.pipeline_fakes import FakeSource, TflopsProbeSource  # noqa: E402

from helpers import matmul_tflops  # noqa: E402
from lightning_zerocopy.pipeline import mps, start_pipeline  # noqa: E402


def main() -> None:
    worker_percent = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    launched = mps.ROOT_ENV in os.environ  # through `python -m lightning_zerocopy.pipeline.mps_launcher ... --`
    daemon = mps.start_mps() if launched else None  # joins the launcher's daemon
    result: dict = {"mps": daemon is not None, "launched": launched}
    if daemon is None:
        print(json.dumps(result), flush=True)
        return
    state = mps._read_state(daemon.root) or {}  # the launcher started the supervisor: its pid is in the state
    result.update(root=daemon.root, daemon_pid=daemon.daemon_pid, supervisor_pid=state.get("supervisor_pid"))
    import subprocess

    import torch

    torch.zeros(1, device="cuda")  # this process's context: an MPS client if the daemon took it

    # 1. batches through CUDA IPC slots, depth 1 so every batch reuses the slot the trainer just read
    client = start_pipeline("worker", depth=1, device="cuda:0", worker_env=daemon.client_env(worker_percent), timeout=120)
    src = FakeSource(steps=6, features=512, batch_size=2048, seed=1)
    client.register("t", src)
    sums = []
    for step, batch in enumerate(client.iterate("t", 0)):
        torch.cuda._sleep(20_000_000)  # the trainer's stream is busy; the read below is queued behind it
        sums.append((batch.x.double().sum(), src.build_batch(src.plan(0, step)).x.double().sum().item()))
    result["ipc_batches_ok"] = all(abs(got.item() - want) < 1e-6 * max(1.0, abs(want)) for got, want in sums)

    # 2. the worker's share: its matmul rate at worker_percent vs. at 90 %
    client.register("probe", TflopsProbeSource(steps=2))
    low = [b.tflops for b in client.iterate("probe", 0)]
    result["worker_pids"] = [client.transport.pid]
    client.close()
    other = start_pipeline("worker", depth=1, device="cuda:0", worker_env=daemon.client_env(90), timeout=120)
    other.register("probe", TflopsProbeSource(steps=2))
    high = [b.tflops for b in other.iterate("probe", 0)]
    result["worker_pids"].append(other.transport.pid)
    other.close()
    def comm(pid: int) -> str:
        return mps._comm(pid)

    result["trainer_pid"] = os.getpid()
    result["mps_processes"] = [f"{pid}:{comm(pid)}" for pid in mps.mps_processes()]
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                         capture_output=True, text=True)  # fmt: skip
    result["compute_apps"] = smi.stdout.strip().splitlines()
    try:
        with open(os.path.join(daemon.log_dir, "control.log")) as f:
            result["control_log"] = [line for line in f.read().splitlines() if "NEW" in line or "server" in line]
    except OSError as exc:
        result["control_log"] = [repr(exc)]
    result["pipe_dir"] = sorted(os.listdir(daemon.pipe_dir))
    result.update(
        worker_percent=worker_percent,
        worker_tflops=max(low),
        worker_tflops_at_90=max(high),
        trainer_percent=os.environ.get(mps.PERCENT_ENV),
        trainer_tflops=matmul_tflops(),
        device=torch.cuda.get_device_name(),
    )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
