"""What NCCL said when a run's ranks built their communicators: its version, the transport each channel runs over
(``P2P/CUMEM``, ``P2P/IPC``, ``SHM``: a pair of MPS clients may lose peer-to-peer), the channel counts and its
warnings. :func:`nccl_debug_env` asks NCCL for this log (``NCCL_DEBUG=INFO`` for the set-up subsystems only, one
file per process); :func:`read_nccl_logs` sums those files up."""

from __future__ import annotations

import glob
import os
import re
from collections import Counter
from typing import Any

__all__ = ["nccl_debug_env", "read_nccl_logs"]

_VIA = re.compile(r"via (\S+)")
_CHANNELS = re.compile(r"(\d+) coll channels, (?:\d+ collnet channels, )?(?:\d+ nvls channels, )?(\d+) p2p channels")
_VERSION = re.compile(r"NCCL version (\S+)")


def nccl_debug_env(directory: str) -> dict[str, str]:
    """The variables that make NCCL log its set-up to ``directory/nccl.<host>.<pid>.log`` (nothing per collective)."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,ENV",
            "NCCL_DEBUG_FILE": os.path.join(directory, "nccl.%h.%p.log")}  # fmt: skip


def read_nccl_logs(directory: str) -> dict[str, Any]:
    """The NCCL logs of ``directory``: ``files``, ``version``, ``transports`` (how many channel connections ran over
    each), ``channels`` (the ``coll``/``p2p`` channel counts each communicator reported), the ``NCCL_*`` variables
    NCCL read, and up to 20 ``warnings`` (``WARN`` lines)."""
    files = sorted(glob.glob(os.path.join(directory, "nccl.*.log")))
    transports: Counter[str] = Counter()
    channels: list[list[int]] = []
    versions: set[str] = set()
    env: set[str] = set()
    warnings: list[str] = []
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if " via " in line and "Channel" in line:
                    match = _VIA.search(line)
                    if match:
                        transports[match.group(1)] += 1
                if (m := _CHANNELS.search(line)) is not None:
                    channels.append([int(m.group(1)), int(m.group(2))])
                if (m := _VERSION.search(line)) is not None:
                    versions.add(m.group(1))
                if " set by environment to " in line:
                    env.add(line.split("NCCL INFO", 1)[-1].strip())
                if "WARN" in line and len(warnings) < 20:
                    warnings.append(line.strip()[-300:])
    return {"files": len(files), "version": sorted(versions), "transports": dict(transports), "channels": channels,
            "env": sorted(env), "warnings": warnings}  # fmt: skip
