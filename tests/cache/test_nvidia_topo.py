"""``nvidia-smi topo -m`` read into a GPU link matrix, and the cache's groups on 2-, 4- and 8-GPU machines.

``topologies/h200x2_nv18.txt`` is the output recorded on the 2 x H200 machine the two-GPU runs used. The others are
written out from the documented layouts of common machines, in the tool's format (tab-separated, NIC rows and
columns, affinity columns, legend): an NVSwitch DGX H100 (every pair NV18), a DGX-1 V100 hybrid cube-mesh (two
NVLink quads, each GPU also linked to one GPU of the other quad, SYS elsewhere), a 4-GPU PCIe server with NVLink
bridges over pairs, and a 4-GPU PCIe server without NVLink.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_zerocopy.cache.cliques import choose_layout, find_cliques
from lightning_zerocopy.cache.cost import compare_policies
from lightning_zerocopy.cache.nvidia_topo import GpuTopology, TopologyParseError, read_gpu_topology
from lightning_zerocopy.cache.read_rates import ReadRates

HERE = Path(__file__).resolve().parent / "topologies"


def topo(name: str) -> GpuTopology:
    return GpuTopology.parse((HERE / name).read_text())


def test_the_recorded_two_gpu_machine() -> None:
    t = topo("h200x2_nv18.txt")  # colour codes in the header, `nvidia-smi -L` lines below the legend
    assert t.gpus == (0, 1) and t.links == (("X", "NV18"), ("NV18", "X"))
    assert t.nvlink_cliques() == [[0, 1]] and t.group_links([0, 1]) == "NV18"


def test_nvswitch_eight_gpus_are_one_clique_and_nic_columns_are_skipped() -> None:
    t = topo("dgx_h100_8_nvswitch.txt")
    assert t.gpus == tuple(range(8)) and all(len(row) == 8 for row in t.links)
    assert t.nvlink_cliques() == [list(range(8))]
    assert t.group_links(range(8)) == "NV18" and t.nvlink_lanes(3, 6) == 18 and t.nvlink_lanes(3, 3) == 0


def test_cube_mesh_is_two_quads_whatever_the_cross_links() -> None:
    t = topo("dgx1_v100_8_cube_mesh.txt")
    # 0-4, 1-5, 2-6, 3-7 are NVLinks too, but no GPU of one quad reaches all of the other: two groups of four
    assert t.nvlink_cliques() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert t.nvlink_lanes(0, 4) == 2 and t.links[0][5] == "SYS"
    assert t.group_links([0, 1, 2, 3]) == "NV1"  # the slowest link inside the quad
    assert t.group_links([0, 4]) == "NV2" and t.group_links([0, 5]) == "SYS"


def test_nvlink_bridge_pairs_and_pcie_only() -> None:
    pairs = topo("pcie_4_nvlink_bridge_pairs.txt")
    assert pairs.nvlink_cliques() == [[0, 1], [2, 3]] and pairs.group_links([0, 1]) == "NV12"
    pcie = topo("pcie_4_no_nvlink.txt")
    assert pcie.nvlink_cliques() == [[0], [1], [2], [3]]
    assert pcie.group_links([0, 1]) == "PIX" and pcie.group_links([0, 1, 2, 3]) == "NODE"


def test_measured_peer_groups_against_the_wires() -> None:
    pcie = topo("pcie_4_no_nvlink.txt")
    # the driver grants peer access over the PCIe switch: the measured groups are no NVLink cliques, and it says so
    note = pcie.mismatch([[0, 1], [2, 3]])
    assert note is not None and "[0,1] over PIX" in note and "[2,3] over PIX" in note
    assert topo("dgx1_v100_8_cube_mesh.txt").mismatch([[0, 1, 2, 3], [4, 5, 6, 7]]) is None


@pytest.mark.parametrize(
    "name,groups",
    [("dgx_h100_8_nvswitch.txt", ((0, 1, 2, 3, 4, 5, 6, 7),)), ("dgx1_v100_8_cube_mesh.txt", ((0, 1, 2, 3), (4, 5, 6, 7))),
     ("pcie_4_nvlink_bridge_pairs.txt", ((0, 1), (2, 3)))],
)  # fmt: skip
def test_clique_policy_shards_over_the_nvlink_groups(name: str, groups: tuple[tuple[int, ...], ...]) -> None:
    # where peer access runs exactly over the NVLinks, the clique layout is the NVLink cliques
    layout = choose_layout("clique", topo(name).nvlink_matrix(), hot_rows=10_000, rows_per_gpu=1_000)
    assert layout.policy == "clique" and layout.groups == groups
    assert layout.note == "clique: shards over GPU groups " + " ".join("[" + ",".join(map(str, g)) + "]" for g in groups)


def test_auto_on_four_and_eight_gpus_prices_the_larger_clique() -> None:
    """Four and eight GPUs: the price is asked for the clique size the matrix gives, and a larger clique (more
    rows cached, a smaller local share) wins only where its extra hits pay for the peer reads."""
    nvlink = ReadRates(local=319.0, peer=199.0, host=45.0)  # the 2 x H200 probe's rates
    asked: list[int] = []

    def price(k: int):
        asked.append(k)
        return compare_policies(replicate_hit=0.34, clique_hit=min(1.0, 0.34 + 0.12 * (k - 1)), group_size=k,
                                rates=nvlink, row_bytes=512)  # fmt: skip

    eight = choose_layout("auto", topo("dgx_h100_8_nvswitch.txt").nvlink_matrix(), 10**8, 10**6, price=price)
    four = choose_layout("auto", topo("dgx1_v100_8_cube_mesh.txt").nvlink_matrix(), 10**8, 10**6, price=price)
    assert asked == [8, 4]
    assert eight.policy == "clique" and eight.groups == (tuple(range(8)),)
    assert four.policy == "clique" and four.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    # the same four GPUs where the extra rows add almost no hits: replicate
    flat = choose_layout("auto", topo("dgx1_v100_8_cube_mesh.txt").nvlink_matrix(), 10**8, 10**6,
                         price=lambda k: compare_policies(0.34, 0.35, k, nvlink, 512))  # fmt: skip
    assert flat.policy == "replicate" and flat.note.startswith("auto: replicate")


def test_four_gpu_subsets_of_an_eight_gpu_machine() -> None:
    # a job given GPUs 2..5 of the cube mesh: 2-3 and 4-5 are linked, 2-4 no (SYS), 2-6 not in the job
    t = topo("dgx1_v100_8_cube_mesh.txt")
    job = [2, 3, 4, 5]
    sub = [[t.nvlink_matrix()[a][b] for b in job] for a in job]
    assert find_cliques(sub) == [[0, 1], [2, 3]]  # positions into the job's devices


def test_bad_text_is_a_clear_error() -> None:
    with pytest.raises(TopologyParseError, match="no header row"):
        GpuTopology.parse("No devices were found\n")
    text = (HERE / "pcie_4_no_nvlink.txt").read_text()
    with pytest.raises(TopologyParseError, match="no row for GPU3"):
        GpuTopology.parse("\n".join(line for line in text.splitlines() if not line.startswith("GPU3")))
    with pytest.raises(TopologyParseError, match="unknown link 'FAST'"):
        GpuTopology.parse(text.replace("PIX", "FAST", 1))


def test_no_nvidia_smi_reads_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert read_gpu_topology() is None
