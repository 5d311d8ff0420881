"""The checkpoint layout of every reference model: its hyperparameters and its state dict's keys and shapes.

``tests/models/checkpoint_layouts.json`` was written by this script from the models as they were before they shared
their bases (commit 6885b16): ``python tests/helpers/checkpoint_layouts.py``. ``tests/models/test_checkpoint_layouts.py``
builds a checkpoint of that layout and loads it with today's classes, so a checkpoint saved before still loads.
Rerun the script only when a layout is meant to change (and say so in the commit).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

LAYOUTS = Path(__file__).parents[1] / "models" / "checkpoint_layouts.json"

_PAPERS, _AUTHORS = 30, 20
_METADATA = (["paper", "author"], [["author", "writes", "paper"], ["paper", "rev_writes", "author"],
                                   ["paper", "cites", "paper"]])  # fmt: skip

#: every reference model, by a name: its class (in ``lightning_zerocopy.models``) and its init arguments (JSON)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "graphsage": ("GraphSAGE", {"in_channels": 6, "out_channels": 3, "hidden_channels": 8}),
    "gat": ("GAT", {"in_channels": 6, "out_channels": 3, "hidden_channels": 8, "heads": 2}),
    "hetero_node_classifier": ("HeteroNodeClassifier", {
        "in_channels": {"paper": 6}, "out_channels": 3, "hidden_channels": 8, "node_types": _METADATA[0],
        "edge_types": ["__".join(e) for e in _METADATA[1]], "num_nodes": {"paper": _PAPERS, "author": _AUTHORS},
        "input_type": "paper"}),
    "hetero_node_classifier_gat": ("HeteroNodeClassifier", {
        "in_channels": {"paper": 6}, "out_channels": 3, "hidden_channels": 8, "conv": "gat", "heads": 2,
        "node_types": _METADATA[0], "edge_types": ["__".join(e) for e in _METADATA[1]],
        "num_nodes": {"paper": _PAPERS, "author": _AUTHORS}, "input_type": "paper"}),
    "link_predictor": ("LinkPredictor", {"in_channels": 6, "hidden_channels": 8}),
    "link_predictor_mlp_bpr": ("LinkPredictor", {"in_channels": 6, "hidden_channels": 8, "decoder": "mlp", "loss": "bpr",
                                                 "hits_k": [5]}),
    "hetero_link_predictor": ("HeteroLinkPredictor", {
        "metadata": _METADATA, "num_features": {"paper": 6}, "num_nodes": {"paper": _PAPERS, "author": _AUTHORS},
        "edge_type": "author__writes__paper", "hidden_channels": 8}),
}  # fmt: skip


def as_json(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples become lists)."""
    return json.loads(json.dumps(value))


def build(name: str) -> torch.nn.Module:
    """The model of case ``name``, built from its init arguments."""
    from lightning_zerocopy import models

    cls, kwargs = CASES[name]
    return getattr(models, cls)(**kwargs)


def layout(model: Any) -> dict[str, Any]:
    """``model``'s hyperparameters (as JSON) and its state dict's keys, in order, with their shapes."""
    return {"hparams": as_json(dict(model.hparams)),
            "state_dict": {k: list(v.shape) for k, v in model.state_dict().items()}}  # fmt: skip


def _dumps(layouts: dict[str, Any]) -> str:
    """JSON with one line per hyperparameter set and per state-dict entry (a diff shows which key changed)."""
    cases = []
    for name, case in layouts.items():
        entries = ",\n".join(f"   {json.dumps(k)}: {json.dumps(v)}" for k, v in case["state_dict"].items())
        cases.append(f' {json.dumps(name)}: {{\n  "class": {json.dumps(case["class"])},\n  "hparams": '
                     f'{json.dumps(case["hparams"])},\n  "state_dict": {{\n{entries}\n  }}\n }}')
    return "{\n" + ",\n".join(cases) + "\n}\n"


def main() -> None:
    torch.manual_seed(0)
    out = {name: {"class": cls, **layout(build(name))} for name, (cls, _) in CASES.items()}
    LAYOUTS.write_text(_dumps(out))
    print(f"wrote {LAYOUTS}")


if __name__ == "__main__":
    main()
