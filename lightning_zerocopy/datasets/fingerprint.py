"""A cheap fingerprint of each cached array file, recorded when a cache is built and checked when it is opened.

A cache is trusted once its ``meta.json`` exists, and a damaged header or a cut-short file is already caught when it is
opened. Well-formed wrong values are not: noise written over ``x.npy`` or a permuted ``y.npy`` trained silently (val
acc 0.34 instead of 0.94). So each file's size and a checksum of sampled blocks (the first and the last block and
evenly spread ones between, :data:`BLOCKS` of :data:`BLOCK_BYTES`; a small file whole) go into ``meta.json`` at build,
and a file that no longer matches is refused naming the file and the fix. Reading the blocks costs about 1 MiB per
file, whatever its size; a change confined to bytes between the sampled blocks is not seen.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Optional

__all__ = ["BLOCKS", "BLOCK_BYTES", "FINGERPRINT_KEY", "changed_file", "fingerprint", "fingerprint_folder"]

BLOCKS = 16
BLOCK_BYTES = 64 * 1024
#: Where ``meta.json`` keeps the fingerprints: ``{file name: {"size": bytes, "blocks": hex digest}}``.
FINGERPRINT_KEY = "fingerprint"


def fingerprint(path: os.PathLike) -> dict[str, Any]:
    """``{"size", "blocks"}`` of the file ``path``: its size and a BLAKE2b digest of its sampled blocks."""
    size = os.path.getsize(path)
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= BLOCKS * BLOCK_BYTES:
            digest.update(f.read())
        else:
            last = size - BLOCK_BYTES
            for i in range(BLOCKS):
                f.seek(last * i // (BLOCKS - 1))
                digest.update(f.read(BLOCK_BYTES))
    return {"size": size, "blocks": digest.hexdigest()}


def fingerprint_folder(folder: Path) -> dict[str, dict[str, Any]]:
    """The fingerprint of every ``.npy`` file in ``folder`` (what a build records in ``meta.json``)."""
    return {p.name: fingerprint(p) for p in sorted(Path(folder).glob("*.npy"))}


def changed_file(path: Path, recorded: Optional[dict[str, Any]]) -> Optional[str]:
    """Why ``path`` no longer matches its ``recorded`` fingerprint (``None``: it matches, or none was recorded)."""
    if not recorded:
        return None
    now = fingerprint(path)
    if now["size"] != recorded.get("size"):
        return f"has {now['size']:,} bytes, {recorded.get('size'):,} when its cache was built"
    if now["blocks"] != recorded.get("blocks"):
        return "holds other bytes than when its cache was built (its sampled blocks' checksum differs)"
    return None
