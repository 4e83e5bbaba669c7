"""Structure descriptors of the catalog datasets: the degree shapes of the generator families, against
graphs those generators make, and the predictions they give against the graphs' own.

References: the degree histogram of a generated graph (``graph generate rmat|grid2d``), the shard
structure counted on it (:func:`plexus_tune.model.sparsity.graph_sparsity`), and the figure
``predict --graph`` gives for it.
"""

from __future__ import annotations

import numpy as np
import pytest

from plexus_tune.graph import generate
from plexus_tune.graph.degrees import grid2d_degree_shape, log_binned_shape, rmat_degree_shape
from plexus_tune.model.costs import predict_grids
from plexus_tune.model.machine import load_machine
from plexus_tune.model.sparsity import degree_structure, descriptor_sparsity, graph_sparsity, graph_summary
from plexus_tune.model.workload import DatasetInfo, Workload, get_dataset, list_datasets

KEYS = ("row_length_cv", "top1pct_column_share", "touched_column_fraction")


def _measured_shape(adjacency):
    degree = np.diff(adjacency.indptr) + 1  # a self-loop per row (the generators store no diagonal)
    values, counts = np.unique(degree, return_counts=True)
    return log_binned_shape(values, counts), float(degree.mean())


@pytest.mark.parametrize("skew", [(0.57, 0.19, 0.19, 0.05), (0.45, 0.22, 0.22, 0.11)])
def test_the_rmat_degree_shape_is_the_generated_graphs(skew):
    nodes, edges = 20000, 200000
    a, b, c, d = skew
    adjacency = generate("rmat", nodes=nodes, edges=edges, a=a, b=b, c=c, d=d, seed=2).adjacency
    measured, mean = _measured_shape(adjacency)
    computed = rmat_degree_shape(nodes, edges, skew)
    assert sum(s for _, s in computed) == pytest.approx(1, abs=1e-6)
    assert sum(r * s for r, s in computed) == pytest.approx(1, rel=1e-3)  # the classes' mean is the mean degree
    for R, C in [(1, 1), (4, 4), (1, 8)]:
        got, want = degree_structure(computed, mean, nodes, R, C), degree_structure(measured, mean, nodes, R, C)
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], rel=0.05), (skew, R, C, key)
        assert got["column_share"][8] == pytest.approx(want["column_share"][8], rel=0.05)


def test_the_rmat_shape_at_products_size_is_the_one_measured_on_the_generated_graph():
    """ogbn-products' descriptor was measured on the generated R-MAT of its size; the computed shape agrees."""
    info = get_dataset("ogbn-products")
    measured = info.structure["degree_shape"]
    computed = rmat_degree_shape(info.nodes, (info.nnz - info.nodes) // 2, info.structure["skew"])
    mean = info.nnz / info.nodes
    for R, C in [(1, 1), (8, 8), (1, 64), (64, 1)]:
        got, want = degree_structure(computed, mean, info.nodes, R, C), degree_structure(measured, mean, info.nodes, R, C)
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], rel=0.03), (R, C, key)


def test_the_lattice_degree_shape_is_the_generated_lattices():
    adjacency = generate("grid2d", nodes=40000, seed=1).adjacency
    measured, mean = _measured_shape(adjacency)
    computed = grid2d_degree_shape(40000)
    for R, C in [(1, 1), (4, 4)]:
        got, want = degree_structure(computed, mean, 40000, R, C), degree_structure(measured, mean, 40000, R, C)
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], rel=0.05, abs=0.01), (R, C, key)


@pytest.mark.parametrize("skew", [(0.57, 0.19, 0.19, 0.05), (0.45, 0.22, 0.22, 0.11)])
def test_a_descriptors_prediction_is_within_20_percent_of_the_graphs(skew):
    """H100 profile, 1x1x1: a dataset's descriptor against predict --graph on the R-MAT of its size and skew;
    the uniformly random shards that a dataset without a descriptor assumes are farther off."""
    nodes, edges = 100000, 1500000
    a, b, c, d = skew
    graph = generate("rmat", nodes=nodes, edges=edges, a=a, b=b, c=c, d=d, seed=1)
    nnz = graph_summary(graph)["normalized_nnz"]
    workload = Workload.from_graph_stats("tiny", nodes, nnz, 100, 47)
    info = DatasetInfo("tiny", nodes, edges, nnz, 100, 47, "test",
                       structure={"generator": "rmat", "skew": skew, "provenance": "test"})
    machine = load_machine("h100-80gb-fitted")
    grids = np.array([[1, 1, 1]])
    want = predict_grids(workload, machine, grids, sparsity=graph_sparsity(graph, grids, workload.layers))["total_ms"][0]
    got = predict_grids(workload, machine, grids, sparsity=descriptor_sparsity(info, workload, grids))["total_ms"][0]
    uniform = predict_grids(workload, machine, grids)["total_ms"][0]
    assert abs(got / want - 1) <= 0.20, (got, want)
    assert abs(got / want - 1) < abs(uniform / want - 1), (got, want, uniform)


@pytest.mark.parametrize("info", list_datasets(), ids=lambda i: i.name)
def test_every_catalog_dataset_has_a_descriptor(info):
    descriptor = info.descriptor()
    assert descriptor is not None and descriptor["provenance"] and descriptor["generator"] in ("rmat", "grid2d")
    shape = np.asarray(descriptor["degree_shape"])
    assert shape[:, 1].sum() == pytest.approx(1, abs=1e-4)
    assert shape[:, 0] @ shape[:, 1] == pytest.approx(1, rel=0.01)  # degree / mean degree averages 1
    workload = Workload.from_graph_stats(info.name, info.nodes, info.nnz, info.features, info.classes)
    grids = np.array([[1, 2, 4], [8, 1, 1]])
    described = descriptor_sparsity(info, workload, grids)
    nnz, forward, _ = described.layer(0, [4, 1], [1, 8])
    assert np.all(np.isfinite(forward["row_length_cv"])) and np.all(nnz > 0)
