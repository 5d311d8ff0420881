"""PipelineCallback through the real ZeroCopyDataModule on the CPU: same batches, same training, faults; the batches,
training and predictions on both graph kinds (``kind``: ``helpers.kinds``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from helpers import RecordBatches, kill_if_running, read_ready_line, sigint_at_default, wait_process_gone
from helpers.kinds import NODE_KINDS, assert_same_fields, fields
from pytorch_lightning.callbacks import Callback

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import DataTelemetry, PipelineCallback
from lightning_zerocopy.callbacks.predictions import PredictionWriter
from lightning_zerocopy.data.handles import HostGraphHandles
from lightning_zerocopy.data.loader import PlanLoader
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.models import GraphSAGE
from lightning_zerocopy.pipeline import start_pipeline
from lightning_zerocopy.pipeline.loader import PipelineLoader
from lightning_zerocopy.pipeline.source import PlanSource

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
UNTYPED, TYPED = NODE_KINDS


def _datamodule(cache: Path, kind=UNTYPED) -> Any:
    """The untyped kind: a 1,500-node synthetic graph (cached in ``cache``), 5 + 5 neighbors, batches of 128; the typed
    one: ``TinyHeteroDataset``, 3 + 2 neighbors, batches of 6, eval batches of 4."""
    if kind.typed:
        return kind.datamodule(batch_size=6, eval_batch_size=4)
    dataset = SyntheticGraph(num_nodes=1500, avg_degree=8, num_features=16, num_classes=4, cache_dir=str(cache))
    return ZeroCopyDataModule(dataset, fanouts=[5, 5], batch_size=128, seed=7)


class _Record(RecordBatches):
    """Every field of every store of each batch (:func:`helpers.kinds.fields`), every training loss, the loader."""

    loader = ""

    def _freeze(self, batch) -> dict:
        return fields(batch)

    def on_train_start(self, trainer, pl_module) -> None:
        self.loader = type(trainer.train_dataloader).__name__


def _fit(tmp_path: Path, kind, *callbacks: Callback) -> tuple[_Record, pl.Trainer]:
    pl.seed_everything(0)
    dm = _datamodule(tmp_path / "cache", kind)
    model = kind.model(dm) if kind.typed else GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=16, dropout=0.0)
    record = _Record(())
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
        callbacks=[*callbacks, record],
    )
    trainer.fit(model, datamodule=dm)
    return record, trainer


def _assert_same_batches(got: dict, want: dict) -> None:
    assert got.keys() == want.keys() and len(want) > 0
    for key, batch in want.items():
        assert_same_fields(got[key], batch, key)


@pytest.fixture(scope="module")
def baselines(tmp_path_factory):
    """The batches, losses and trained model without the pipeline, by kind, fitted on first use."""
    fitted = {}

    def get(kind):
        if str(kind) not in fitted:
            record, trainer = _fit(tmp_path_factory.mktemp(f"baseline-{kind}"), kind)
            fitted[str(kind)] = record, trainer.lightning_module
        return fitted[str(kind)]

    return get


@pytest.mark.parametrize("mode, lookahead", [("worker", True), ("in_process", True), ("in_process", False)])
@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_toggling_the_callback_changes_no_batch(tmp_path, baselines, kind, mode, lookahead):
    """Same train and val batches (every field of every store, bitwise; a typed batch crosses the slots flattened),
    the same losses and the same trained weights with and without the pipeline, with three stages (sampling one batch
    ahead of the gather) or two."""
    want, want_model = baselines(kind)
    pipeline = PipelineCallback(mode=mode, lookahead=lookahead)
    telemetry = DataTelemetry()
    record, trainer = _fit(tmp_path, kind, pipeline, telemetry)
    assert record.loader == "PipelineLoader" and want.loader == "PlanLoader"
    _assert_same_batches(record.train, want.train)
    _assert_same_batches(record.val, want.val)
    assert record.losses == want.losses and {epoch for epoch, _ in record.train} == {0, 1}
    for a, b in zip(trainer.lightning_module.parameters(), want_model.parameters()):
        assert torch.equal(a, b)
    assert pipeline.client is None  # torn down after fit
    assert trainer.datamodule.loader_factory is None  # handed back at teardown
    assert not any(name.endswith("_dataloader") for name in vars(trainer.datamodule))  # nothing patched
    for key in ("data/stall_ms", "data/stall_frac", "data/step_ms", "data/wait_ms", "data/seps", "data/gather_GBps", "data/build_ms"):
        assert f"{key}_epoch" in trainer.callback_metrics, key
    steps = telemetry.history  # an epoch's first step has no interval; the producer's build time beside the others
    counted = [f for (epoch, step), f in sorted(record.train.items()) if step > 0]
    assert len(steps) == len(counted) > 0
    assert all(0 <= s["data/stall_frac"] <= 1 and s["data/build_ms"] > 0 and s["data/seps"] > 0 for s in steps)
    if kind.typed:  # the slot views' sizes, counted per type; a type without features has no x
        assert [s["data/rows_author"] for s in steps] == [float(f[("author", "n_id")].numel()) for f in counted]
        assert any(("author", "x") not in f for f in record.train.values())


def test_predict_outputs_survive_later_batches(tmp_path):
    """predict_step returns batch.n_id; with slot views the next batch would overwrite collected outputs."""
    dm = _datamodule(tmp_path / "cache")
    model = GraphSAGE(dm.num_features, dm.num_classes, hidden_channels=16, dropout=0.0)
    kwargs = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    want = pl.Trainer(**kwargs).predict(model, datamodule=dm)
    got = pl.Trainer(**kwargs, callbacks=[PipelineCallback(mode="in_process")]).predict(model, datamodule=dm)
    assert len(got) == len(want) > 1
    for a, b in zip(got, want):
        assert torch.equal(a["n_id"], b["n_id"]) and torch.equal(a["logits"], b["logits"])


@pytest.mark.parametrize("kind", NODE_KINDS, ids=str)
def test_predictions_written_through_the_pipeline_equal_those_without(tmp_path: Path, kind) -> None:
    """predict_split=all through PredictionWriter: the same rows (ids, logits, pred, prob) with and without the
    pipeline; a typed graph's rows are its input type's and say so."""
    files = []
    for callbacks in ([], [PipelineCallback(mode="in_process")]):
        out = tmp_path / str(len(callbacks))
        dm = kind.datamodule(batch_size=6, eval_batch_size=3, predict_split="all")
        torch.manual_seed(0)
        model = kind.model(dm).eval()
        pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   callbacks=[*callbacks, PredictionWriter(str(out))]).predict(model, datamodule=dm,
                                                                               return_predictions=False)  # fmt: skip
        files.append(dict(np.load(out / "predictions.npz")))
    assert files[0]["node_id"].tolist() == list(range(40))
    assert ("node_type" in files[1]) == kind.typed and (not kind.typed or str(files[1]["node_type"]) == "paper")
    for key in ("node_id", "logits", "pred", "prob"):
        assert np.array_equal(files[0][key], files[1][key]), key


@contextlib.contextmanager
def _train_pipeline(dm: ZeroCopyDataModule, monkeypatch) -> Iterator[Any]:
    """``dm`` set up for fit and an in-process pipeline client serving its train plan; closed and unlinked after."""
    unlink = HostGraphHandles.unlink
    monkeypatch.setattr(HostGraphHandles, "unlink", lambda self: None)  # keep the names until the producer opened them
    dm.setup("fit")
    handles = dm.handles
    client = start_pipeline("in_process", depth=2, timeout=30)
    try:
        client.register("train", PlanSource(dm.plan("train"), dm.builder("train")))
        yield client
    finally:
        client.close()
        unlink(handles)


def test_pipeline_loader_resumes_mid_epoch_like_the_plan_loader(tmp_path, monkeypatch):
    """Checkpointed loader state is interchangeable between PlanLoader and PipelineLoader."""
    dm = _datamodule(tmp_path / "cache")
    try:
        with _train_pipeline(dm, monkeypatch) as client:
            plain = dm.train_dataloader()
            piped = PipelineLoader(client, "train", dm.train_dataloader())
            for loader in (plain, piped):
                loader.set_epoch(1)
            it_plain, it_piped = iter(plain), iter(piped)
            for _ in range(3):
                assert torch.equal(next(it_plain).n_id, next(it_piped).n_id)
            state = piped.state_dict()
            assert state == plain.state_dict()
            del it_piped
            resumed = PipelineLoader(client, "train", dm.train_dataloader())
            resumed.load_state_dict(state)
            fresh = PlanLoader(dm.plan("train"), dm.builder("train"))
            fresh.load_state_dict(state)
            count = 0
            for a, b in zip(resumed, fresh):  # in lockstep: a pipeline batch is valid until the next one is asked for
                assert torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index)
                count += 1
            assert count == len(plain) - 3
    finally:
        dm.teardown("fit")


def test_constructor_checks_and_mps_unavailable_warning(monkeypatch):
    with pytest.raises(ValueError, match="mode"):
        PipelineCallback(mode="threads")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth"):
        PipelineCallback(depth=0)
    with pytest.raises(ValueError, match="worker_sm_percent"):
        PipelineCallback(worker_sm_percent=100)
    with pytest.raises(ValueError, match="worker_sm_percent='auto'.*set mps: true"):
        PipelineCallback(worker_sm_percent="auto")  # auto picks an MPS share: without MPS there is none
    assert PipelineCallback(worker_sm_percent="auto", mps=True)._first_share == 10
    with pytest.raises(ValueError, match="copy_stages"):
        PipelineCallback(copy_stages=("training",))
    with pytest.raises(ValueError, match="needs a worker process"):
        PipelineCallback(mode="in_process", mps=True)
    from lightning_zerocopy.pipeline import mps

    # CUDA already initialized in this process (as on a GPU machine after other tests): no MPS for the trainer;
    # also when only the driver was (torch.cuda.device_count() does that, torch.cuda.is_initialized() stays False)
    monkeypatch.setattr(mps, "_warned", set())  # no earlier unavailability in this process
    monkeypatch.setattr(mps, "start_mps", lambda: pytest.fail("no daemon may start once CUDA is initialized"))
    for torch_state, driver_state in ((True, False), (False, True)):
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: torch_state)
        monkeypatch.setattr(mps, "cuda_driver_initialized", lambda: driver_state)
        callback = PipelineCallback(mode="worker", mps=True)  # stores its config, starts nothing
        with pytest.warns(mps.MPSUnavailableWarning, match="has initialized CUDA already"):
            assert callback.join_mps() is None and callback.mps_daemon is None
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(mps, "cuda_driver_initialized", lambda: False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(mps, "_warned", set())
    callback = PipelineCallback(mode="worker", mps=True)
    with pytest.warns(mps.MPSUnavailableWarning, match="not on PATH"):
        callback.join_mps()
    assert callback.mps_daemon is None and mps.PERCENT_ENV not in os.environ
    with pytest.raises(TypeError, match="plan\\(split\\), builder\\(split\\) and use_loader_factory"):
        callback.attach_host_memory(None, object())  # type: ignore[arg-type]


def test_the_constructor_only_stores_config(monkeypatch):
    from lightning_zerocopy.pipeline import mps, mps_launcher

    monkeypatch.setattr(mps, "start_mps", lambda *a, **k: pytest.fail("the constructor must not start MPS"))
    monkeypatch.setattr(mps_launcher, "start_for_trainer", lambda *a, **k: pytest.fail("the constructor must not start MPS"))
    callback = PipelineCallback(mode="worker", mps=True, worker_sm_percent=20)
    assert (callback.mps, callback.worker_sm_percent, callback.mps_daemon, callback.client) == (True, 20, None, None)


def test_importing_the_callbacks_imports_no_pyg():
    """PyG initializes the CUDA driver on import: a script must be able to import the callback before MPS starts."""
    code = (
        "import sys, lightning_zerocopy.callbacks as c; c.PipelineCallback(mps=True); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch_geometric'); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_after_the_command_found_mps_unavailable_the_callback_does_not_warn_again(monkeypatch):
    """The command tried first and said why MPS is unavailable; the callback, constructed after PyG initialized
    CUDA, must not add a second warning telling the user to use the command they used."""
    from lightning_zerocopy.pipeline import mps, mps_launcher

    monkeypatch.setattr(mps, "_warned", set())
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.warns(mps.MPSUnavailableWarning, match="not on PATH"):
        assert mps_launcher.start_for_trainer(10) is None  # what lightning-zerocopy does before loading the recipe
    monkeypatch.setattr(mps, "cuda_driver_initialized", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mps.MPSUnavailableWarning)
        callback = PipelineCallback(mode="auto", mps=True)
        assert callback.join_mps() is None
    assert callback.resolve_mode(torch.device("cuda", 0), gpu_builder=True) == "in_process"


def test_auto_mode_is_the_measured_fastest_for_the_setup(monkeypatch):
    from lightning_zerocopy.pipeline import mps

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert PipelineCallback().resolve_mode(cpu) == "in_process"
    assert PipelineCallback().resolve_mode(cpu, gpu_builder=True) == "in_process"
    assert PipelineCallback().resolve_mode(cuda, gpu_builder=True) == "in_process"
    assert PipelineCallback().resolve_mode(cuda, gpu_builder=False) == "worker"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(mps, "cuda_driver_initialized", lambda: False)
    monkeypatch.setattr(mps, "_warned", set())
    monkeypatch.setattr(mps, "start_mps", lambda: mps.MPSDaemon("/nonexistent", 1, None, owner=False))
    assert PipelineCallback(mps=True).resolve_mode(cuda, gpu_builder=True) == "worker"  # MPS up: the worker
    monkeypatch.setattr(mps, "start_mps", lambda: None)  # asked for but unavailable: as without MPS
    assert PipelineCallback(mps=True).resolve_mode(cuda, gpu_builder=True) == "in_process"
    assert PipelineCallback(mps=True).resolve_mode(cuda, gpu_builder=False) == "worker"
    for mode in ("worker", "in_process"):
        assert PipelineCallback(mode=mode).resolve_mode(cuda, gpu_builder=True) == mode
    assert PipelineCallback().worker_sm_percent == 10


def test_ctrl_c_in_the_trainer_stops_the_worker_and_leaks_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [sys.executable, str(HERE.parent / "scripts" / "pipeline_fit_script.py"), str(tmp_path / "cache")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=sigint_at_default,
    )
    worker_pid = None
    try:
        line = read_ready_line(proc, timeout=90)
        assert line is not None, f"trainer did not start: {proc.stderr.read()[-3000:]}"
        worker_pid = int(line.split()[1])
        shm_before = {n for n in os.listdir("/dev/shm") if n.startswith(f"lzc-{proc.pid}-")}
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)  # generous: CI machines can be loaded
        err = proc.stderr.read()
        assert "KeyboardInterrupt" in err or "graceful shutdown" in err or proc.returncode != 0
        assert wait_process_gone(worker_pid, 5), "the pipeline worker outlived the interrupted trainer"
        assert not {n for n in os.listdir("/dev/shm") if n.startswith(f"lzc-{proc.pid}-")}, shm_before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        kill_if_running(worker_pid)


def test_pipeline_loader_deals_an_epoch_resumed_on_another_world_size_like_the_plan_loader(tmp_path, monkeypatch):
    """A checkpoint of a 2-rank run resumed on 1 rank: the producer builds the remainder batches the PlanLoader
    would (the resumed plan is registered with it)."""
    dm = _datamodule(tmp_path / "cache")
    try:
        with _train_pipeline(dm, monkeypatch) as client:
            state = dm.train_dataloader().state_dict()
            batch_size = state["plan"]["batch_size"]
            state.update(epoch=1, step=2, segments=[[2, batch_size, 2]])
            state["plan"] = dict(state["plan"], world_size=2)
            piped = PipelineLoader(client, "train", dm.train_dataloader())
            piped.load_state_dict(state)
            fresh = dm.train_dataloader()
            fresh.load_state_dict(state)
            start = fresh.start_step
            assert piped.start_step == start > 0
            count = 0
            for a, b in zip(piped, fresh):
                assert torch.equal(a.n_id, b.n_id) and torch.equal(a.x, b.x)
                count += 1
            assert count == len(fresh) - start
            two_ranks = [dm.plan("train", rank=r, world_size=2) for r in range(2)]
            done = {int(s) for r in two_ranks for step in range(2) for s in r.item(1, step).seed_ids}
            later = [int(s) for step in range(start, len(fresh)) for s in fresh.plan.item(1, step).seed_ids]
            assert not done & set(later) and len(done) + len(later) == dm.plan("train").input_nodes.numel()
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("trainer_share, expected", [(None, "80"), (100, "100")])
def test_the_callback_starts_mps_with_the_trainers_own_share(monkeypatch, trainer_share, expected):
    from lightning_zerocopy.pipeline import mps, mps_launcher

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(mps, "cuda_driver_initialized", lambda: False)
    monkeypatch.setattr(mps, "start_mps", lambda: mps.MPSDaemon("/nonexistent", 1, None, owner=True))
    monkeypatch.delenv(mps.ROOT_ENV, raising=False)
    monkeypatch.setenv(mps.PERCENT_ENV, "unset")  # restored after the test: start_for_trainer writes os.environ
    monkeypatch.setenv(mps_launcher.WORKER_PERCENT_ENV, "unset")
    callback = PipelineCallback(mode="worker", mps=True, worker_sm_percent=20, trainer_sm_percent=trainer_share)
    assert callback.join_mps() is not None
    assert os.environ[mps.PERCENT_ENV] == expected and os.environ[mps_launcher.WORKER_PERCENT_ENV] == "20"


@pytest.mark.parametrize("hook", ["on_exception", "teardown"])
def test_a_run_stopping_on_an_exception_gives_its_producers_a_short_close(hook: str, monkeypatch) -> None:
    """On an exception the producers get EXCEPTION_CLOSE_S to stop (a worker behind a stream that never drains never
    stops, and the job has ~10 s to end); a run that ends normally gives them the full wait. Before that close, a
    failed run aborts its NCCL group (``run_failed``): a collective a peer never joins would hold its GPU waits."""
    from lightning_zerocopy.callbacks import pipeline
    from lightning_zerocopy.callbacks.pipeline import EXCEPTION_CLOSE_S

    calls: list[str] = []
    monkeypatch.setattr(pipeline, "run_failed", lambda exception: calls.append("run_failed"))

    class _Session:
        auto = None
        closed_with: list[float] = []

        def close(self, timeout: float = 5.0) -> None:
            self.closed_with.append(timeout)
            calls.append("close")

    callback = PipelineCallback(mode="worker")
    session = _Session()
    callback._session = session  # type: ignore[assignment]
    if hook == "on_exception":
        callback.on_exception(None, None, RuntimeError("boom"))  # type: ignore[arg-type]
    else:
        callback.teardown(None, None, "fit")  # type: ignore[arg-type]
    assert session.closed_with == [EXCEPTION_CLOSE_S if hook == "on_exception" else 5.0]
    assert EXCEPTION_CLOSE_S <= 1.0
    assert calls == (["run_failed", "close"] if hook == "on_exception" else ["close"])
