"""The GPU link matrix of ``nvidia-smi topo -m``, and the NVLink cliques it implies.

The cache's groups come from *measured* peer access (:func:`~lightning_zerocopy.cache.cliques.measure_peer_access`);
this module reads what the driver reports about the wires, so a run can say which links its groups sit on and a
benchmark can record whether the measured groups are the NVLink ones. Peer access may also run over PCIe (``PIX``,
``PXB``, sometimes ``PHB``), where a peer read is no faster than a host read; only ``NV#`` links count as NVLink here.

Example::

    topo = GpuTopology.parse(subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True).stdout)
    topo.nvlink_cliques()      # [[0, 1, 2, 3, 4, 5, 6, 7]] on an NVSwitch machine
    topo.group_links([0, 1])   # "NV18"
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Optional, Sequence

from lightning_zerocopy.cache.cliques import find_cliques

__all__ = ["GpuTopology", "TopologyParseError", "read_gpu_topology"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU = re.compile(r"^GPU(\d+)$")
_NVLINK = re.compile(r"^NV(\d+)$")
_LINKS = ("X", "SYS", "NODE", "PHB", "PXB", "PIX", "SOC")  # SOC: older drivers' name for SYS


class TopologyParseError(ValueError):
    """The text is not an ``nvidia-smi topo -m`` GPU matrix; the message says what was expected."""


@dataclass(frozen=True)
class GpuTopology:
    """The GPU-to-GPU part of ``nvidia-smi topo -m``.

    Attributes:
        gpus: the GPU indices, in the matrix's order (``GPU0`` → ``0``).
        links: ``links[i][j]``: the link between the ``i``-th and ``j``-th GPU as printed (``"X"`` on the diagonal,
            ``"NV18"``, ``"PIX"``, ``"SYS"``, ...).
    """

    gpus: tuple[int, ...]
    links: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, text: str) -> "GpuTopology":
        """Read the GPU rows and columns of ``nvidia-smi topo -m`` output (NIC rows and columns, CPU/NUMA
        affinity and the legend are skipped; colour codes are removed).

        Raises:
            TopologyParseError: no header with ``GPU<n>`` columns, a GPU row missing or short, or an unknown link.
        """
        lines = [_ANSI.sub("", line).split() for line in text.splitlines()]
        header = next((tokens for tokens in lines if len(tokens) > 1 and _GPU.match(tokens[0])
                       and not _is_link(tokens[1])), None)  # fmt: skip
        if header is None:
            raise TopologyParseError("no header row with GPU0, GPU1, ... columns: pass the output of `nvidia-smi topo -m`")
        gpus = tuple(int(m.group(1)) for m in _leading_gpus(header))  # GPU columns come first, then NICs, affinities
        rows: dict[int, list[str]] = {}
        for tokens in lines:
            match = _GPU.match(tokens[0]) if tokens else None
            if match and tokens is not header and len(tokens) > len(gpus) and _is_link(tokens[1]):
                rows[int(match.group(1))] = tokens[1 : 1 + len(gpus)]
        missing = [g for g in gpus if g not in rows]
        if missing:
            raise TopologyParseError(f"the matrix has no row for GPU{missing[0]}")
        links = tuple(tuple(rows[g]) for g in gpus)
        for i, row in enumerate(links):
            for j, link in enumerate(row):
                if not _is_link(link):
                    raise TopologyParseError(f"GPU{gpus[i]} -> GPU{gpus[j]}: unknown link {link!r}")
                if (i == j) != (link == "X"):
                    raise TopologyParseError(f"GPU{gpus[i]} -> GPU{gpus[j]}: 'X' belongs on the diagonal only")
        return cls(gpus, links)

    def nvlink_lanes(self, i: int, j: int) -> int:
        """NVLinks between the ``i``-th and ``j``-th GPU (``0``: none; the diagonal counts as none)."""
        match = _NVLINK.match(self.links[i][j])
        return int(match.group(1)) if match else 0

    def nvlink_matrix(self) -> list[list[bool]]:
        """``m[i][j]``: an NVLink joins GPUs ``i`` and ``j`` (``True`` on the diagonal), the form
        :func:`~lightning_zerocopy.cache.cliques.find_cliques` takes."""
        n = len(self.gpus)
        return [[i == j or self.nvlink_lanes(i, j) > 0 for j in range(n)] for i in range(n)]

    def nvlink_cliques(self) -> list[list[int]]:
        """The groups the ``clique`` policy would form if peer access ran exactly over the NVLinks (positions into
        :attr:`gpus`, largest first, as :func:`find_cliques` returns them)."""
        return find_cliques(self.nvlink_matrix())

    def group_links(self, group: Sequence[int]) -> str:
        """The slowest link inside ``group`` (positions), as printed: ``"NV18"``, ``"NV4"``, ``"PIX"``, ...; ``"X"``
        for one GPU. NVLink beats every PCIe level; more lanes beat fewer; PCIe levels rank
        ``PIX < PXB < PHB < NODE < SYS`` (nearest first)."""
        pairs = [(a, b) for k, a in enumerate(group) for b in group[k + 1 :]]
        if not pairs:
            return "X"
        return max((self.links[a][b] for a, b in pairs), key=_link_distance)

    def mismatch(self, groups: Sequence[Sequence[int]]) -> Optional[str]:
        """Why measured peer groups are not the NVLink cliques (one line), or ``None`` where they are."""
        measured = sorted(sorted(g) for g in groups)
        expected = sorted(sorted(g) for g in self.nvlink_cliques())
        if measured == expected:
            return None
        slow = [f"[{','.join(map(str, g))}] over {self.group_links(g)}" for g in measured
                if len(g) > 1 and not _NVLINK.match(self.group_links(g))]  # fmt: skip
        where = "; peer groups " + ", ".join(slow) if slow else ""
        return (f"peer groups {_groups(measured)} differ from the NVLink cliques {_groups(expected)}{where}")  # fmt: skip


def _is_link(token: str) -> bool:
    return token in _LINKS or bool(_NVLINK.match(token))


def _leading_gpus(header: list[str]) -> list[re.Match[str]]:
    out = []
    for token in header:
        match = _GPU.match(token)
        if not match:
            break
        out.append(match)
    return out


def _link_distance(link: str) -> tuple[int, int]:
    match = _NVLINK.match(link)
    if match:
        return 0, -int(match.group(1))
    order = {"X": -1, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5, "SOC": 5}
    return 1, order[link]


def _groups(groups: Sequence[Sequence[int]]) -> str:
    return " ".join("[" + ",".join(map(str, g)) + "]" for g in groups)


def read_gpu_topology(timeout_s: float = 60.0) -> Optional[GpuTopology]:
    """This machine's :class:`GpuTopology` from ``nvidia-smi topo -m``, or ``None`` where ``nvidia-smi`` is
    missing, fails or prints no GPU matrix (a CPU machine, a container without the tool)."""
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    try:
        return GpuTopology.parse(out.stdout)
    except TopologyParseError:
        return None
