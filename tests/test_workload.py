import pytest

from plexus_tune.errors import UserError
from plexus_tune.model.workload import Workload, get_dataset, list_datasets, workload_from_dataset


def test_catalog_has_every_design_dataset():
    names = {d.name for d in list_datasets()}
    assert names == {
        "Reddit", "ogbn-products", "Isolate-3-8M", "products-14M", "europe_osm", "ogbn-papers100M",
        "ogbn-arxiv", "ogb-lsc-mag240M", "IGB260M", "UK-2007-05",
    }


def test_paper_table_values_and_case_insensitive_lookup():
    info = get_dataset("OGBN-PRODUCTS")
    assert (info.nodes, info.edges, info.nnz, info.features, info.classes) == (
        2_449_029, 61_859_140, 126_167_053, 100, 47)
    papers = get_dataset("ogbn-papers100m")
    assert papers.nnz == 1_726_745_828 and papers.classes == 172


def test_derived_nonzeros_for_other_datasets():
    arxiv = get_dataset("ogbn-arxiv")
    assert arxiv.nnz == 2 * 1_166_243 + 169_343 == 2_501_829
    uk = get_dataset("uk-2007-05")
    assert uk.nnz == 2 * 3_738_733_648 + 105_896_555
    assert (uk.features, uk.classes) == (128, 32)
    assert "2 * edges + nodes" in uk.source
    # the rule reproduces the paper's own count for Reddit exactly
    reddit = get_dataset("reddit")
    assert 2 * reddit.edges + reddit.nodes == reddit.nnz


def test_unknown_dataset_lists_known_names():
    with pytest.raises(UserError) as exc:
        get_dataset("ogbn-nothing")
    assert "ogbn-products" in str(exc.value) and "Reddit" in str(exc.value)


def test_widths():
    w = workload_from_dataset("ogbn-products", layers=3, hidden=128)
    assert w.widths == (100, 128, 128, 47) and w.layers == 3 and w.bytes_per_element == 4
    assert workload_from_dataset("reddit", layers=1).widths == (602, 41)
    w2 = Workload.from_graph_stats("g", 10, 30, 5, 2, layers=2, hidden=7)
    assert w2.widths == (5, 7, 2)


@pytest.mark.parametrize("kwargs", [
    dict(nodes=0, nnz=5, widths=(3, 2)),
    dict(nodes=5, nnz=-1, widths=(3, 2)),
    dict(nodes=5, nnz=5, widths=(3, 0)),
    dict(nodes=5, nnz=5, widths=(3,)),
    dict(nodes=5, nnz=5, widths=(3, 2.5)),
])
def test_bad_workloads(kwargs):
    with pytest.raises(UserError):
        Workload(name="bad", **kwargs)


def test_bad_layers_or_hidden():
    with pytest.raises(UserError):
        workload_from_dataset("reddit", layers=0)
    with pytest.raises(UserError):
        workload_from_dataset("reddit", hidden=-3)
