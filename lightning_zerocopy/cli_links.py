"""What the data knows, given to the model's constructor by the ``lightning-zerocopy`` command.

A module written for PyG takes the graph's shape under PyG's names: ``in_channels``/``out_channels`` (or
``num_features``/``num_classes``), and for a heterogeneous graph ``metadata`` (``to_hetero(model, metadata)``) and
``num_nodes`` per type. :data:`DATA_LINKS` links each from the DataModule (``data.num_features``, ``data.metadata()``,
...) into the model argument of that name, where the module has one and the DataModule knows the value;
jsonargparse leaves a link alone when either side is missing.

:class:`ModelInstantiator` builds the model (in place of LightningCLI's own instantiator) and

* records in the module's hyperparameters (the checkpoint) only the links the module took: LightningCLI also records
  those jsonargparse skipped, so a module without ``in_channels`` got one in its checkpoint, and ``test``/``predict
  --ckpt_path`` then failed with ``unexpected keyword argument 'in_channels'`` (such a key in an older checkpoint is
  dropped when the module does not take it);
* turns ``metadata`` given as lists (YAML has no tuples) into PyG's ``(node types, [(src, rel, dst), ...])``, which
  ``to_hetero`` needs;
* stops with one line naming a required argument that nothing gave (``model.init_args.metadata``) and the key or
  DataModule that fills it, instead of the module failing on ``None``.

:func:`predict_step_hint` is the ``predict_step`` to suggest for a module without one, for the batch kind the
DataModule yields (node or link batches, ``Data`` or ``HeteroData``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, get_args

from pytorch_lightning.cli import LightningArgumentParser, _InstantiatorFn

from lightning_zerocopy._cli_errors import CommandError

__all__ = ["DATA_LINKS", "ModelInstantiator", "add_data_links", "as_metadata", "predict_step_hint", "yaml_metadata"]

#: ``(DataModule attribute, model argument)``: the value of the attribute (called, if it is a method) is given to the
#: model argument of that name.
DATA_LINKS: tuple[tuple[str, str], ...] = (
    ("num_features", "in_channels"),
    ("num_features", "num_features"),
    ("num_classes", "out_channels"),
    ("num_classes", "num_classes"),
    ("metadata", "metadata"),
    ("num_nodes", "num_nodes"),
)
_FILLED_BY = {target: source for source, target in DATA_LINKS}


def as_metadata(value: Any) -> tuple[list[str], list[tuple[str, str, str]]]:
    """PyG's metadata ``(node types, edge types)`` from a pair of sequences (YAML lists, a :class:`Metadata`), each
    edge type a tuple (from a list of three names or PyG's ``"src__rel__dst"``), as ``to_hetero`` takes it.

    Raises:
        ValueError: not a pair of node types and edge types.
    """
    if callable(value):
        value = value()
    try:
        node_types, edge_types = value
        edge_types = [tuple(e.split("__")) if isinstance(e, str) else tuple(e) for e in edge_types]
    except (TypeError, ValueError):
        edge_types = None
    if edge_types is None or not all(len(e) == 3 and all(isinstance(p, str) for p in e) for e in edge_types):
        raise ValueError(f"metadata must be (node types, edge types), each edge type (src, relation, dst), as PyG's "
                         f"HeteroData.metadata() gives it; got {value!r}")  # fmt: skip
    return [str(t) for t in node_types], edge_types


def yaml_metadata(model_config: Any) -> None:
    """A model config's ``metadata`` (in ``init_args`` or ``dict_kwargs``, e.g. from a checkpoint's hyperparameters)
    as YAML writes it, lists in place of tuples, so that the run's config dumps without jsonargparse's warning that a
    tuple does not survive the round trip; :class:`ModelInstantiator` gives the module tuples."""
    for section in ("init_args", "dict_kwargs"):
        values = model_config.get(section) if model_config is not None else None
        if values is not None and values.get("metadata") is not None:
            node_types, edge_types = as_metadata(values["metadata"])
            values["metadata"] = [node_types, [list(e) for e in edge_types]]


def _value_of(attribute: str) -> Callable[[Any], Any]:
    def value(source: Any) -> Any:
        source = source() if callable(source) else source  # `metadata()` in PyG, a property in older DataModules
        return as_metadata(source) if attribute == "metadata" else source

    return value


def add_data_links(parser: LightningArgumentParser) -> None:
    """Link each of :data:`DATA_LINKS` from ``data`` into ``model.init_args`` when both are instantiated."""
    for source, target in DATA_LINKS:
        parser.link_arguments(f"data.{source}", f"model.init_args.{target}", compute_fn=_value_of(source),
                              apply_on="instantiate")  # fmt: skip


def _parameters(class_type: type) -> tuple[dict[str, inspect.Parameter], bool]:
    """The keyword parameters of ``class_type``'s constructor, and whether it takes ``**kwargs``."""
    try:
        parameters = list(inspect.signature(class_type.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return {}, True
    named = {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind == p.VAR_KEYWORD for p in parameters)


def _admits_none(annotation: Any) -> bool:
    """Whether ``None`` is a value the annotation allows (an untyped argument: no, ``None`` is only the parser's
    placeholder for a value nobody gave)."""
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):  # postponed annotations
        return "Optional" in annotation or "None" in annotation or annotation.strip() in ("Any", "typing.Any")
    return annotation is Any or annotation is None or type(None) in get_args(annotation)


class ModelInstantiator(_InstantiatorFn):
    """LightningCLI's model instantiator, plus what the module docstring lists."""

    def __init__(self, cli: Any) -> None:
        super().__init__(cli=cli, key="model")

    def __call__(self, class_type: type, *args: Any, applied_instantiation_links: dict, **kwargs: Any) -> Any:
        parameters, open_ended = _parameters(class_type)
        if not open_ended:  # a link target in an older checkpoint's hyperparameters that the module does not take
            kwargs = {k: v for k, v in kwargs.items() if k in parameters or k not in _FILLED_BY}
        if kwargs.get("metadata") is not None:
            kwargs["metadata"] = as_metadata(kwargs["metadata"])
        self._check_required(class_type, parameters, kwargs)
        taken = {key: value for key, value in applied_instantiation_links.items()
                 if not key.startswith("model.") or key.rpartition(".")[2] in kwargs}  # fmt: skip
        if "metadata" in kwargs:  # recorded as the module gets it
            taken["model.init_args.metadata"] = kwargs["metadata"]
        return super().__call__(class_type, *args, applied_instantiation_links=taken, **kwargs)

    def _check_required(self, class_type: type, parameters: dict[str, inspect.Parameter], kwargs: dict) -> None:
        for name, parameter in parameters.items():
            if parameter.default is not parameter.empty or kwargs.get(name) is not None:
                continue
            if _admits_none(parameter.annotation) and name in kwargs:
                continue
            key, module = f"model.init_args.{name}", f"{class_type.__module__}.{class_type.__qualname__}"
            source = _FILLED_BY.get(name)
            if source is None:
                raise CommandError(f"{key}: {module} requires it and the recipe does not set it: set {key} in the "
                                   f"recipe (or pass --{key} VALUE)")  # fmt: skip
            data = self._data_class_path()
            raise CommandError(
                f"{key}: {module} requires it and nothing gave it: the command fills it from data.{source}, which "
                f"{data} does not have ({_HAS.get(source, 'a DataModule with that attribute')} has it); use such a "
                f"DataModule or set {key} in the recipe"
            )

    def _data_class_path(self) -> str:
        config = self.cli.config
        subcommand = config.get("subcommand")
        path = config.get(f"{subcommand}.data.class_path" if subcommand else "data.class_path")
        return str(path) if path else "the recipe's DataModule"


_HAS = {
    "metadata": "a heterogeneous DataModule, e.g. lightning_zerocopy.ZeroCopyHeteroDataModule,",
    "num_nodes": "a heterogeneous DataModule, e.g. lightning_zerocopy.ZeroCopyHeteroDataModule,",
    "num_classes": "a node-classification DataModule, e.g. lightning_zerocopy.ZeroCopyDataModule,",
}


def predict_step_hint(datamodule: Optional[Any]) -> str:
    """The ``predict_step`` to suggest for a module without one, for the batches ``datamodule`` yields, and what the
    prediction writer takes from it."""
    edge_type = _attribute(datamodule, "edge_type")
    input_type = _attribute(datamodule, "input_type")
    hetero = _attribute(datamodule, "metadata") is not None
    if edge_type is not None:  # heterogeneous link batches
        src, _, dst = edge_type
        return (f"`def predict_step(self, batch, batch_idx): z = self(batch.x_dict, batch.edge_index_dict); "
                f"src, dst = batch[{tuple(edge_type)!r}].edge_label_index; return (z[{src!r}][src] * "
                f"z[{dst!r}][dst]).sum(-1)` (a score per edge_label_index pair; the writer takes the pairs' ids "
                "from the batch)")  # fmt: skip
    if hetero and input_type is not None:
        return (f"`def predict_step(self, batch, batch_idx): return self(batch.x_dict, batch.edge_index_dict)"
                f"[{input_type!r}][: batch[{input_type!r}].batch_size]` (the logits of the seed {input_type!r} "
                f"nodes; the writer takes their ids from batch[{input_type!r}].n_id)")  # fmt: skip
    if _is_link(datamodule):
        return ("`def predict_step(self, batch, batch_idx): z = self(batch.x, batch.edge_index); src, dst = "
                "batch.edge_label_index; return (z[src] * z[dst]).sum(-1)` (a score per edge_label_index pair; the "
                "writer takes the pairs' ids from the batch)")  # fmt: skip
    return ("`def predict_step(self, batch, batch_idx): return self(batch.x, batch.edge_index)[: batch.batch_size]` "
            "(the logits of the seed nodes; the writer takes their ids from batch.n_id)")  # fmt: skip


def _attribute(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001  (a property that refuses, e.g. a link DataModule's input_type)
        return None


def _is_link(datamodule: Any) -> bool:
    from lightning_zerocopy.data.link_datamodule import ZeroCopyLinkDataModule

    return isinstance(datamodule, ZeroCopyLinkDataModule)
