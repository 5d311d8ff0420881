"""PyG's ``to_hetero`` pattern as its ogbn-mag examples write it (``examples/hetero/to_hetero_mag.py``'s ``GNN``, and
``examples/pytorch_lightning/relational_gnn.py``'s LightningModule with ``dropout`` left out): a homogeneous GNN of lazy
``SAGEConv((-1, -1), ...)`` layers made heterogeneous by ``to_hetero(GNN(...), metadata, aggr="sum")``. Nothing here
knows lightning-zerocopy; the command must train it as it is.

:class:`NetWithPredictStep` is the same module completed with the ``predict_step`` the command suggests for
heterogeneous batches, and nothing else."""

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv, to_hetero


class GNN(torch.nn.Module):
    def __init__(self, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), hidden_channels)
        self.conv2 = SAGEConv((-1, -1), out_channels)

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        x = self.conv2(x, edge_index)
        return x


class Net(pl.LightningModule):
    def __init__(self, metadata, hidden_channels, out_channels):
        super().__init__()
        self.save_hyperparameters()
        model = GNN(hidden_channels, out_channels)
        self.model = to_hetero(model, metadata, aggr="sum")

    def forward(self, x_dict, edge_index_dict):
        return self.model(x_dict, edge_index_dict)

    def common_step(self, batch):
        batch_size = batch["paper"].batch_size
        y_hat = self(batch.x_dict, batch.edge_index_dict)["paper"][:batch_size]
        y = batch["paper"].y[:batch_size]
        return y_hat, y

    def training_step(self, batch, batch_idx):
        y_hat, y = self.common_step(batch)
        loss = F.cross_entropy(y_hat, y)
        self.log("train_loss", loss, batch_size=y_hat.size(0))
        return loss

    def validation_step(self, batch, batch_idx):
        y_hat, y = self.common_step(batch)
        self.log("val_acc", (y_hat.argmax(dim=-1) == y).float().mean(), batch_size=y_hat.size(0))

    def test_step(self, batch, batch_idx):
        y_hat, y = self.common_step(batch)
        self.log("test_acc", (y_hat.argmax(dim=-1) == y).float().mean(), batch_size=y_hat.size(0))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class NetWithPredictStep(Net):
    def predict_step(self, batch, batch_idx):
        return self(batch.x_dict, batch.edge_index_dict)["paper"][: batch["paper"].batch_size]
