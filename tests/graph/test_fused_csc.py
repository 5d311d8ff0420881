"""fuse_csc: one CSC over every edge type (GraphBolt's CSC with edge-type offsets), built from the per-type CSCs, and
the host copy's shared one."""

from __future__ import annotations

import pytest
import torch

from helpers.hetero import AUTHOR, EDGE_TYPES, INST, PAPER, TinyHeteroDataset, make_hetero_data
from lightning_zerocopy.data.host.share import share_host_data
from lightning_zerocopy.data.resources import HostData
from lightning_zerocopy.graph.csc import CSCGraph
from lightning_zerocopy.graph.fused_csc import fuse_csc, fused_index_dtype
from lightning_zerocopy.graph.shared_memory import SharedTensorHandle, TensorSliceHandle


def _graphs(data):
    return {et: CSCGraph.from_edge_index(ei, max(data.num_nodes[et[0]], data.num_nodes[et[2]]))
            for et, ei in data.edge_index.items()}  # fmt: skip


def _assert_fuses(fused, graphs, num_nodes) -> None:
    """Every target's fused neighborhood is its edge type's, shifted into the typed node space, with its edge ids."""
    layout, g = fused.layout, fused.graph
    assert g.indptr.numel() == layout.num_ids + 1 and int(g.indptr[0]) == 0 and int(g.indptr[-1]) == g.num_edges
    for k, (et, graph) in enumerate(graphs.items()):
        src, _, dst = et
        assert layout.num_targets[k] == num_nodes[dst]
        base = layout.node_base(src)
        for j in range(num_nodes[dst]):
            t = layout.target_offset[k] + j
            lo, hi = int(g.indptr[t]), int(g.indptr[t + 1])
            mine = slice(int(graph.indptr[j]), int(graph.indptr[j + 1]))
            assert torch.equal(g.indices[lo:hi].long() - base, graph.indices[mine].long()), (et, j)
            assert torch.equal(g.edge_perm[lo:hi], graph.edge_perm[mine]), (et, j)
            assert layout.edge_offset[k] <= lo <= hi <= layout.edge_offset[k + 1]


def test_every_target_keeps_its_edge_types_neighbors_in_the_typed_node_space() -> None:
    data = make_hetero_data()
    graphs = _graphs(data)
    fused = fuse_csc(graphs, data.num_nodes, list(data.num_nodes))
    layout = fused.layout
    assert layout.node_types == (PAPER, AUTHOR, INST) and layout.node_offset == (0, 40, 100)
    assert layout.edge_types == tuple(EDGE_TYPES) and layout.num_targets == (40, 40, 60, 60)
    assert layout.target_offset == (0, 40, 80, 140) and layout.num_ids == 200  # 200 targets > 107 nodes
    assert fused.graph.indices.dtype == torch.int32 and fused.graph.validate() is fused.graph
    _assert_fuses(fused, graphs, data.num_nodes)


def test_without_node_counts_the_csc_spans_serve_and_sampling_reads_the_same_neighbors() -> None:
    data = make_hetero_data()
    graphs = _graphs(data)
    fused = fuse_csc(graphs)  # counts implied: paper 40 (cites), author 60, institution 60 (employs spans authors)
    assert fused.layout.node_offset == (0, 40, 100)
    _assert_fuses(fused, graphs, {PAPER: 40, AUTHOR: 60, INST: 60})


def test_the_index_dtype_widens_past_int32() -> None:
    top = torch.iinfo(torch.int32).max
    assert fused_index_dtype(top + 1) == torch.int32  # ids 0 .. 2^31 - 1
    assert fused_index_dtype(top + 2) == torch.int64


def test_a_csc_with_edges_past_its_destination_count_is_refused() -> None:
    data = make_hetero_data()
    with pytest.raises(ValueError, match=r"edges into 'paper' ids past its 10 nodes"):
        fuse_csc(_graphs(data), {PAPER: 10, AUTHOR: 60, INST: 7})


def test_the_host_copy_shares_one_fused_csc_and_its_builders_read_it() -> None:
    dataset = TinyHeteroDataset()
    handles = share_host_data(dataset.load())
    try:
        assert handles.fused is not None and handles.fused in handles.key()  # one placement per host memory
        host = HostData.open(handles)
        _assert_fuses(host.fused, host.graphs, host.num_nodes)
        for k, (et, graph) in enumerate(handles.graphs):  # the edge ids are held once: views of the fused ones
            block = host.fused.layout.edge_offset[k : k + 2]
            assert graph.edge_perm == TensorSliceHandle(handles.fused.graph.edge_perm, *block)
            assert isinstance(graph.indices, SharedTensorHandle) and graph.indices.exists()
        from lightning_zerocopy.data.batch import HeteroBatchBuilder
        from lightning_zerocopy.data.resources import DeviceResources

        resources = DeviceResources(handles)
        builder = HeteroBatchBuilder(handles, {et: [2, 2] for et in EDGE_TYPES}, num_threads=1).open(resources)
        sampler = builder._cpu_sampler
        assert sampler.fused is resources.host.fused and sampler.kernels == {}  # no private fuse, no per-type kernels
        builder.close()
    finally:
        handles.unlink()
