"""User errors of the ``lightning-zerocopy`` command as one message naming the recipe key, not a traceback.

Two kinds: parse errors (jsonargparse's message without its usage block and value dumps) and errors raised while
the recipe's classes are built (the exception's own message, with the argument it names rewritten to the full
YAML key, e.g. ``data.init_args.fanouts``). ``LZC_TRACEBACK=1`` restores jsonargparse's usage block and the full
traceback.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import sys
import traceback
from types import TracebackType
from typing import Any, Iterator, NoReturn, Optional, Sequence

from pytorch_lightning.cli import LightningArgumentParser

__all__ = [
    "TRACEBACK_ENV",
    "CommandError",
    "ZeroCopyArgumentParser",
    "describe_build_error",
    "describe_unknown_key",
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


_PARSER_KEY = re.compile(r'^\s*(?:- )?Parser key "([^"]+)":\s*$')
_CLASS_PATH = re.compile(r"Problem with given class_path '([\w.]+)':")
_NOT_ACCEPTED = re.compile(r"Option '([\w.]+)' is not accepted")
_CALLABLE_CLASS = re.compile(r"class_path='([\w.]+)'")
_SUBCOMMAND_KEY = re.compile(r"does not accept option '([\w.]+)'")


def describe_unknown_key(message: str, valid_keys: Sequence[str] = ()) -> Optional[str]:
    """One line for a parse error about a key that does not exist: the key's full YAML path and the closest valid key.

    jsonargparse nests such an error under every enclosing key and class (``Parser key "data":`` / ``Problem with
    given class_path '...':`` / ``Option 'neg_sampling_ration' is not accepted``), so the key came lines after the
    first one. The closest valid key is looked up among the init arguments of the class the key was given to, or among
    ``valid_keys`` (the subcommand's own options) for a top-level key.

    Returns:
        ``None`` when ``message`` is about something else.
    """
    top = _SUBCOMMAND_KEY.search(message)
    if top is not None:
        return _unknown(top.group(1), top.group(1), [k for k in valid_keys if not k.endswith(".help")], "")
    path: list[str] = []
    owner: Optional[str] = None
    for line in message.splitlines():
        key, cls, bad = _PARSER_KEY.match(line), _CLASS_PATH.search(line), _NOT_ACCEPTED.search(line)
        if key is not None:
            path.append(key.group(1))
        elif cls is not None:
            owner = cls.group(1)
            path.append("init_args")
        if bad is not None:
            callable_class = _CALLABLE_CLASS.search(line)
            if callable_class is not None:  # a callable's class (e.g. an optimizer): `key: {class_path, init_args}`
                owner = callable_class.group(1)
                path.append("init_args")
            name = bad.group(1)
            options = _init_arguments(owner) if owner is not None else []
            return _unknown(".".join([*path, name]), name, options, f" of {owner}" if owner else "")
    return None


def _unknown(key: str, name: str, options: Sequence[str], of: str) -> str:
    leaf = options and "." not in options[0]  # init arguments are leaf names; the subcommand's keys are full paths
    close = difflib.get_close_matches(name if leaf else key, options, n=1, cutoff=0.6)
    if close:
        return f"`{key}` is not an option{of}: did you mean `{close[0]}`?"
    listed = f" (its options: {', '.join(options)})" if options and len(options) <= 30 else ""
    return f"`{key}` is not an option{of}{listed}"


def _init_arguments(class_path: str) -> list[str]:
    """The keyword arguments a class's constructor takes (following ``**kwargs`` into its bases)."""
    cls = resolve_class_path(class_path)
    names: list[str] = []
    for klass in inspect.getmro(cls) if isinstance(cls, type) else ():
        if "__init__" not in vars(klass):
            continue
        try:
            parameters = inspect.signature(klass.__init__).parameters.values()
        except (TypeError, ValueError):
            break
        names += [p.name for p in parameters if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return list(dict.fromkeys(names))


class ZeroCopyArgumentParser(LightningArgumentParser):
    """LightningArgumentParser whose errors print the message and a one-line hint, not the usage block; a key that
    does not exist is named in full with the closest valid one."""

    def error(self, message: str, ex: Optional[Exception] = None) -> NoReturn:  # noqa: D102
        if not self.exit_on_error or traceback_requested():
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        unknown = describe_unknown_key(message, [str(a.dest) for a in parser._actions])
        sys.stderr.write(f"error: {unknown or condense_parse_error(message)}\n")
        sys.stderr.write(f"(`{prog} --help` lists the options; {TRACEBACK_ENV}=1 shows the full usage)\n")
        self.exit(2)


def describe_build_error(exc: BaseException, config: Any) -> str:
    """One message for an exception raised while the recipe's classes were built.

    The innermost exception's message (a :class:`CommandError`'s as it is), with the argument names it mentions
    rewritten to its YAML key (found
    by the class that was being built when it was raised, e.g. ``data.init_args.dataset.init_args.root``), or
    prefixed with the class's key when it names no argument.
    """
    root = exc
    while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    message = str(root) or type(root).__name__
    if isinstance(root, CommandError):  # already one message naming the key (e.g. a model's missing argument)
        return message
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
