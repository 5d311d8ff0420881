"""ZeroCopyDDPStrategy end to end on one GPU (CUDA-marked): every policy one GPU can run (clique degenerates to
replicate), batches bitwise equal to the host table's rows, the whole table on the GPU when it fits, and the
measured hit rate as the presampling predicted."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback
from torch_geometric.nn import SAGEConv

from lightning_zerocopy import ZeroCopyDataModule
from lightning_zerocopy.callbacks import DataTelemetry
from lightning_zerocopy.datasets import SyntheticGraph
from lightning_zerocopy.strategies import ZeroCopyDDPStrategy

NUM_NODES = 20000
FEATURES = 32  # 128-byte rows
ROW_BYTES = FEATURES * 4


class _SAGE(pl.LightningModule):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = SAGEConv(in_channels, out_channels)

    def training_step(self, data, batch_idx):
        return F.cross_entropy(self.conv(data.x, data.edge_index)[: data.batch_size], data.y[: data.batch_size])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _CheckRows(Callback):
    """Every batch's ``x`` is bitwise the host table's rows of ``n_id``."""

    def __init__(self) -> None:
        self.checked = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        table = trainer.datamodule._builders["train"]._host.features.data
        assert batch.x.is_cuda
        assert torch.equal(batch.x.cpu(), table[batch.n_id.cpu()])
        self.checked += 1


def _fit(tmp_path: Path, budget, ranking: str, policy: str, epochs: int = 1, extra_callbacks=(),
         sampler_placement: str = "cpu", **strategy_kwargs):
    dataset = SyntheticGraph(num_nodes=NUM_NODES, avg_degree=10, num_features=FEATURES, num_classes=5,
                             cache_dir=str(tmp_path / "data"))  # fmt: skip
    dm = ZeroCopyDataModule(dataset, fanouts=[10, 5], batch_size=256, gather="zerocopy", seed=3,
                            sampler_placement=sampler_placement)  # fmt: skip
    strategy = ZeroCopyDDPStrategy(cache_budget=budget, cache_ranking=ranking, cache_policy=policy,
                                   presample_batches=64, **strategy_kwargs)  # fmt: skip
    check, telemetry = _CheckRows(), DataTelemetry(prog_bar=False)
    trainer = pl.Trainer(accelerator="gpu", devices=1, strategy=strategy, max_epochs=epochs, limit_val_batches=0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[check, telemetry, *extra_callbacks])  # fmt: skip
    trainer.fit(_SAGE(FEATURES, 5), datamodule=dm)
    assert check.checked > 0
    return strategy.cache_decision, telemetry.cache_history


@pytest.mark.cuda
@pytest.mark.parametrize("policy", ["replicate", "clique", "auto"])
@pytest.mark.parametrize("ranking", ["degree", "presample"])
def test_each_policy_on_one_gpu_gathers_the_right_rows(tmp_path: Path, policy: str, ranking: str) -> None:
    budget = (NUM_NODES // 5) * ROW_BYTES + 4 * NUM_NODES  # 20% of the rows, beside the lookup (4 B per row)
    if policy == "clique":
        with pytest.warns(UserWarning, match="one GPU"):
            decision, history = _fit(tmp_path, budget, ranking, policy)
    else:
        decision, history = _fit(tmp_path, budget, ranking, policy)
    assert decision.layout.policy == "replicate"  # one GPU: clique degenerates
    assert sum(decision.rows_per_type.values()) == NUM_NODES // 5 and not decision.whole_table
    assert history and history[-1]["cache/peer_rows"] == 0
    assert 0 < history[-1]["cache/hit_rate"] < 1
    assert history[-1]["cache/local_rows"] > 0 and history[-1]["cache/host_rows"] > 0


@pytest.mark.cuda
def test_auto_puts_the_whole_table_on_the_gpu_when_it_fits(tmp_path: Path) -> None:
    decision, history = _fit(tmp_path, "90%", "degree", "auto")
    assert decision.whole_table and decision.layout.policy == "replicate"
    assert sum(decision.rows_per_type.values()) == NUM_NODES
    assert history[-1]["cache/host_rows"] == 0 and history[-1]["cache/hit_rate"] == 1.0


@pytest.mark.cuda
def test_measured_hit_rate_matches_the_presampled_prediction(tmp_path: Path) -> None:
    budget = (NUM_NODES // 5) * ROW_BYTES + 4 * NUM_NODES  # and the lookup
    decision, history = _fit(tmp_path, budget, "presample", "replicate", epochs=2)
    measured = history[-1]["cache/hit_rate"]
    assert abs(measured - decision.expected_hit_rate) < 0.05, (measured, decision.expected_hit_rate)


@pytest.mark.cuda
def test_presample_hits_at_least_as_often_as_degree(tmp_path: Path) -> None:
    budget = (NUM_NODES // 5) * ROW_BYTES + 4 * NUM_NODES  # and the lookup
    _, degree = _fit(tmp_path / "d", budget, "degree", "replicate")
    _, presample = _fit(tmp_path / "p", budget, "presample", "replicate")
    assert presample[-1]["cache/hit_rate"] >= degree[-1]["cache/hit_rate"] - 0.01


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["worker", "in_process"])
def test_the_pipeline_producer_gathers_through_the_same_cache(tmp_path: Path, mode: str) -> None:
    """A PipelineCallback producer (a worker process opens the trainer's shard over CUDA IPC) builds the same rows."""
    from lightning_zerocopy.callbacks import PipelineCallback

    budget = (NUM_NODES // 5) * ROW_BYTES + 4 * NUM_NODES  # and the lookup
    decision, history = _fit(tmp_path, budget, "degree", "replicate", extra_callbacks=[PipelineCallback(mode=mode)])
    assert sum(decision.rows_per_type.values()) == NUM_NODES // 5
    if mode == "in_process":  # the producer's cache is this process's: its counts are the strategy's
        assert history and history[-1]["cache/local_rows"] > 0


@pytest.mark.cuda
@pytest.mark.parametrize("sampler_placement", ["uva", "gpu"])
def test_every_sampler_placement_gathers_through_the_cache(tmp_path: Path, sampler_placement: str) -> None:
    budget = (NUM_NODES // 5) * ROW_BYTES + 4 * NUM_NODES  # and the lookup
    decision, history = _fit(tmp_path, budget, "presample", "auto", sampler_placement=sampler_placement)
    assert sum(decision.rows_per_type.values()) == NUM_NODES // 5
    assert history[-1]["cache/local_rows"] > 0 and history[-1]["cache/host_rows"] > 0



@pytest.mark.cuda
def test_ddp_is_built_on_the_stream_the_forwards_use(tmp_path: Path) -> None:
    """Lightning 2.6 builds DDP under a side stream, so a fit on one GPU warned "The AccumulateGrad node's stream
    does not match the stream of the node that produced the incoming gradient" (issue 22). The strategy builds it
    on the forwards' stream. torch warns once per process, so the fit runs in a fresh one."""
    import sys

    from helpers import run_single_rank_ddp

    script = (
        "import sys, warnings; from pathlib import Path; warnings.simplefilter('always'); "
        f"sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_zerocopy_ddp_cuda import _fit; "
        f"_fit(Path({str(tmp_path)!r}), 0, 'degree', 'replicate', epochs=2)"
    )
    proc = run_single_rank_ddp([sys.executable, "-c", script], timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "AccumulateGrad" not in proc.stderr, proc.stderr[-3000:]
