"""User errors of the ``lightning-zerocopy`` command as one message naming the recipe key, not a traceback.

Two kinds: parse errors (jsonargparse's message without its usage block and value dumps) and errors raised while
the recipe's classes are built (the exception's own message, with the argument it names rewritten to the full
YAML key, e.g. ``data.init_args.fanouts``). ``LZC_TRACEBACK=1`` restores jsonargparse's usage block and the full
traceback.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from types import TracebackType
from typing import Any, Iterator, NoReturn, Optional

from pytorch_lightning.cli import LightningArgumentParser

__all__ = [
    "TRACEBACK_ENV",
    "CommandError",
    "ZeroCopyArgumentParser",
    "describe_build_error",
    "resolve_class_path",
    "traceback_requested",
]

TRACEBACK_ENV = "LZC_TRACEBACK"
"""Set to ``1`` for the full traceback (and jsonargparse's usage block) instead of the one-line message."""

_NOISE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value type:",
    "Given value:",
    "- Expected a <class 'NoneType'>",
)


class CommandError(Exception):
    """A user error of the command: printed as ``error: <message>``, exit status 2."""


def traceback_requested() -> bool:
    """Whether ``LZC_TRACEBACK`` asks for full tracebacks."""
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")


def condense_parse_error(message: str) -> str:
    """jsonargparse's error without the union bookkeeping and value dumps (which repeat the whole recipe)."""
    kept = [line for line in message.splitlines() if line.strip() and not line.strip().startswith(_NOISE)]
    return "\n".join(line if len(line) <= 300 else line[:297] + "..." for line in kept) or message


class ZeroCopyArgumentParser(LightningArgumentParser):
    """LightningArgumentParser whose errors print the message and a one-line hint, not the usage block."""

    def error(self, message: str, ex: Optional[Exception] = None) -> NoReturn:  # noqa: D102
        if not self.exit_on_error or traceback_requested():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {condense_parse_error(message)}\n")
        sys.stderr.write(f"(`{prog} --help` lists the options; {TRACEBACK_ENV}=1 shows the full usage)\n")
        self.exit(2)


def describe_build_error(exc: BaseException, config: Any) -> str:
    """One message for an exception raised while the recipe's classes were built.

    The innermost exception's message, with the argument names it mentions rewritten to its YAML key (found
    by the class that was being built when it was raised, e.g. ``data.init_args.dataset.init_args.root``), or
    prefixed with the class's key when it names no argument.
    """
    root = exc
    while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    message = str(root) or type(root).__name__
    if not isinstance(root, (ValueError, TypeError, OSError)):
        message = f"{type(root).__name__}: {message}"
    cls = _class_being_built(root.__traceback__)
    located = _find_key(config, cls) if cls is not None else None
    if located is None:
        return message
    key, init_args = located
    return _name_key(message, key, init_args)


def _class_being_built(tb: Optional[TracebackType]) -> Optional[type]:
    """The innermost class that jsonargparse/LightningCLI was instantiating in ``tb`` (local ``class_type``)."""
    found = None
    for frame, _ in traceback.walk_tb(tb):
        candidate = frame.f_locals.get("class_type")
        if isinstance(candidate, type):
            found = candidate
    return found


def _find_key(config: Any, cls: type) -> Optional[tuple[str, list[str]]]:
    """``(key, init arg names)`` of the first ``class_path`` node in ``config`` that resolves to ``cls``."""
    tree = config.as_dict() if hasattr(config, "as_dict") else config
    subcommand = tree.get("subcommand") if isinstance(tree, dict) else None
    if subcommand and isinstance(tree.get(subcommand), dict):
        tree = tree[subcommand]
    for key, node in _class_nodes(tree, ""):
        if resolve_class_path(node["class_path"]) is cls:
            init_args = node.get("init_args")
            return key, list(init_args) if isinstance(init_args, dict) else []
    return None


def _class_nodes(tree: Any, prefix: str) -> Iterator[tuple[str, dict]]:
    if isinstance(tree, dict):
        if isinstance(tree.get("class_path"), str):
            yield prefix, tree
        for name, value in tree.items():
            yield from _class_nodes(value, f"{prefix}.{name}" if prefix else str(name))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _class_nodes(value, f"{prefix}[{i}]")


def resolve_class_path(class_path: str) -> Optional[type]:
    """The class ``class_path`` names (``package.module.Name``), or ``None`` when it cannot be imported."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001  (an unimportable path is not the one being built)
        return None


def _name_key(message: str, key: str, init_args: list[str]) -> str:
    """Rewrites each mention of an init argument (bare, or with a partial prefix such as ``data.``) to
    ``<key>.init_args.<name>``; prefixes ``<key>:`` when the message mentions none."""
    if not init_args:
        return f"{key}: {message}"
    names = "|".join(re.escape(n) for n in sorted(init_args, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w/.-])(?:[A-Za-z_]\w*\.)*({names})(?![\w/-])")
    rewritten, count = pattern.subn(lambda m: f"{key}.init_args.{m.group(1)}", message)
    return rewritten if count else f"{key}: {message}"
