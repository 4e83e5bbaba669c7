"""Workloads (graph size and GCN layer widths) and the built-in dataset catalog.

A :class:`Workload` is what the cost model needs: N nodes, NNZ nonzeros of the
normalized adjacency (self-loops included), the layer widths D_0..D_L (input
features, hidden widths, classes) and the byte size of one element.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from plexus_tune.errors import UserError
from plexus_tune.graph.degrees import grid2d_degree_shape, rmat_degree_shape


#: The deepest GCN a workload may have (docs/cli.md, Sizes): the deepest GCNs trained in the
#: literature have about a thousand layers; every model evaluation and trainer loop is linear in L.
MAX_LAYERS = 1000


def check_layers(layers) -> int:
    """``layers`` as an int in [1, :data:`MAX_LAYERS`]; UserError otherwise."""
    layers = int(layers)
    if not 1 <= layers <= MAX_LAYERS:
        raise UserError(f"{layers:,} GCN layers is outside 1..{MAX_LAYERS:,}, the depths this model and its trainers "
                        "cover; give fewer layers", parameter="layers")
    return layers


def model_widths(features: int, classes: int, layers: int, hidden: int) -> list[int]:
    """Layer widths D_0..D_L of the GCN (the trainer builds these): ``[features] + [hidden] * (layers - 1) + [classes]``."""
    return [int(features)] + [int(hidden)] * (check_layers(layers) - 1) + [int(classes)]


@dataclass(frozen=True)
class DatasetInfo:
    """One catalog entry. ``nnz`` counts the adjacency nonzeros with self-loops."""

    name: str
    nodes: int
    edges: int
    nnz: int
    features: int
    classes: int
    source: str
    #: the structure descriptor: ``{"generator": "rmat" | "grid2d", "skew": (a, b, c, d) of an R-MAT,
    #: "provenance": text}`` and ``"degree_shape": [[degree / mean degree, share of the nodes], ...]``
    #: where it is given rather than computed (:meth:`descriptor`), or None
    structure: dict | None = None

    def descriptor(self) -> dict | None:
        """The structure descriptor with its degree shape: the one given, else that of the generator
        family at this dataset's N and (NNZ - N) / 2 undirected edges (:mod:`plexus_tune.graph.degrees`)."""
        if self.structure is None:
            return None
        if "degree_shape" in self.structure:
            return dict(self.structure)
        return {**self.structure, "degree_shape": _family_shape(self.structure["generator"],
                                                                tuple(self.structure.get("skew", ())),
                                                                self.nodes, (self.nnz - self.nodes) // 2)}


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool):
        raise UserError(f"{what} must be a positive integer, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UserError(f"{what} must be a positive integer, got {value!r}") from None
    if isinstance(value, float) and not value.is_integer():
        raise UserError(f"{what} must be a positive integer, got {value!r}")
    if number < 1:
        raise UserError(f"{what} must be a positive integer, got {value!r}")
    return number


@dataclass(frozen=True)
class Workload:
    """A GCN training workload.

    ``widths`` = (D_0, ..., D_L): layer i maps D_i columns to D_{i+1}; so
    ``layers`` = len(widths) - 1.
    """

    name: str
    nodes: int
    nnz: int
    widths: tuple[int, ...]
    bytes_per_element: int = 4

    def __post_init__(self):
        object.__setattr__(self, "nodes", _positive_int(self.nodes, "the number of nodes"))
        object.__setattr__(self, "nnz", _positive_int(self.nnz, "the number of nonzeros"))
        if self.nnz < self.nodes:
            raise UserError(f"{self.nnz:,} nonzeros for {self.nodes:,} nodes: the adjacency with self-loops has at least "
                            f"one nonzero per node", parameter=("nodes", "nnz"))
        if self.nnz > self.nodes * self.nodes:
            raise UserError(f"{self.nnz:,} nonzeros for {self.nodes:,} nodes: an N x N adjacency holds at most "
                            f"N^2 = {self.nodes * self.nodes:,}", parameter=("nodes", "nnz"))
        widths = tuple(self.widths)
        if len(widths) < 2:
            raise UserError(f"a workload needs at least two widths (input and output), got {widths!r}")
        check_layers(len(widths) - 1)
        object.__setattr__(
            self, "widths", tuple(_positive_int(w, f"layer width D_{i}") for i, w in enumerate(widths))
        )
        object.__setattr__(self, "bytes_per_element", _positive_int(self.bytes_per_element, "bytes per element"))

    @property
    def layers(self) -> int:
        return len(self.widths) - 1

    @classmethod
    def from_graph_stats(cls, name, nodes, nnz, features, classes, layers=3, hidden=128, bytes_per_element=4):
        """Workload of a ``layers``-layer GCN: widths :func:`model_widths` (features, hidden x (layers-1), classes)."""
        layers = _positive_int(layers, "the number of layers")
        hidden = _positive_int(hidden, "the hidden width")
        features = _positive_int(features, "layer width D_0")
        classes = _positive_int(classes, f"layer width D_{layers}")
        widths = tuple(model_widths(features, classes, layers, hidden))
        return cls(name=name, nodes=nodes, nnz=nnz, widths=widths, bytes_per_element=bytes_per_element)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "nodes": self.nodes,
            "nnz": self.nnz,
            "widths": list(self.widths),
            "layers": self.layers,
            "bytes_per_element": self.bytes_per_element,
        }


_PAPER = "Plexus paper (SC25) Table 4"

#: The normalized degree distribution (a self-loop per node included) of a Graph500 R-MAT
#: (a, b, c, d = .57, .19, .19, .05) with ogbn-products' nodes and undirected edges,
#: log-binned: [mean degree of the bin / mean degree, share of the nodes].
_RMAT_PRODUCTS = {
    "degree_shape": [
    [0.019411, 0.326011656], [0.038822, 0.124901338], [0.058233, 0.072169011], [0.085842, 0.088223945],
    [0.124613, 0.045911665], [0.175054, 0.047404094], [0.240742, 0.064511282], [0.31627, 0.03040062],
    [0.449058, 0.007222863], [0.618295, 0.042366179], [0.775734, 0.05030361], [0.971961, 0.003246593],
    [1.636569, 0.000465491], [2.077459, 0.040158773], [2.414085, 0.016745004], [3.10576, 1.225e-06],
    [5.504817, 1.1025e-05], [6.763927, 0.026027867], [7.677506, 0.000540622], [18.343398, 4.08e-07],
    [21.030364, 0.009829202], [60.589935, 1.8375e-05], [63.791064, 0.002813768], [185.779432, 0.000612488],
    [508.454346, 9.3506e-05], [1283.298442, 8.983e-06], [2941.815095, 4.08e-07]],
    "provenance": ("degree shape of 'plexus-tune graph generate rmat --nodes 2449029 --edges 61859012 --seed 0' "
                   "(Graph500 skew a=.57 b=.19 c=.19 d=.05), ogbn-products' size, in 27 log-spaced degree classes"),
}
_DERIVED = "nnz derived as 2 * edges + nodes (undirected edges stored both ways plus self-loops)"
_RMAT_PRODUCTS["generator"], _RMAT_PRODUCTS["skew"] = "rmat", (0.57, 0.19, 0.19, 0.05)


@functools.cache
def _family_shape(generator: str, skew: tuple, nodes: int, edges: int) -> list:
    return grid2d_degree_shape(nodes) if generator == "grid2d" else rmat_degree_shape(nodes, edges, skew)


def _rmat_like(kind: str) -> dict:
    """The descriptor of a power-law dataset: the Graph500 R-MAT of its size."""
    return {"generator": "rmat", "skew": (0.57, 0.19, 0.19, 0.05),
            "provenance": f"{kind}: degree shape of the Graph500 R-MAT (a=.57 b=.19 c=.19 d=.05) of its N nodes and "
                          "(NNZ - N)/2 undirected edges, computed from the R-MAT's pair probabilities (no published "
                          "degree distribution used; the generator family of ogbn-products' descriptor)"}


_ROAD_LIKE = {"generator": "grid2d",
              "provenance": "road network: degree shape of the 4-neighbour lattice of 'graph generate grid2d' (10 % of "
                            "links dropped, 1 % long edges), scaled to the dataset's mean degree (no published degree "
                            "distribution used)"}

_CATALOG = (
    DatasetInfo("Reddit", 232_965, 57_307_946, 114_848_857, 602, 41, _PAPER, structure=_rmat_like("social network")),
    DatasetInfo("ogbn-products", 2_449_029, 61_859_140, 126_167_053, 100, 47, _PAPER, structure=_RMAT_PRODUCTS),
    DatasetInfo("Isolate-3-8M", 8_745_542, 654_620_251, 1_317_986_044, 128, 32, _PAPER + "; synthetic features/labels",
                structure=_rmat_like("protein similarity network")),
    DatasetInfo("products-14M", 14_249_639, 115_394_635, 245_036_907, 128, 32, _PAPER + "; synthetic features/labels",
                structure=_rmat_like("co-purchase network")),
    DatasetInfo("europe_osm", 50_912_018, 54_054_660, 159_021_338, 128, 32, _PAPER + "; synthetic features/labels",
                structure=_ROAD_LIKE),
    DatasetInfo("ogbn-papers100M", 111_059_956, 1_615_685_872, 1_726_745_828, 100, 172, _PAPER,
                structure=_rmat_like("citation network")),
    DatasetInfo(
        "ogbn-arxiv", 169_343, 1_166_243, 2 * 1_166_243 + 169_343, 128, 40,
        "Plexus thesis/paper (nodes, edges, features, classes); " + _DERIVED, structure=_rmat_like("citation network"),
    ),
    DatasetInfo(
        "ogb-lsc-mag240M", 121_751_666, 2_593_241_212, 2 * 2_593_241_212 + 121_751_666, 768, 153,
        "paper-citation part, as quoted in the Plexus papers; " + _DERIVED, structure=_rmat_like("citation network"),
    ),
    DatasetInfo(
        "IGB260M", 269_346_174, 3_995_777_033, 2 * 3_995_777_033 + 269_346_174, 1024, 19,
        "as quoted in the Plexus papers; " + _DERIVED, structure=_rmat_like("citation network"),
    ),
    DatasetInfo(
        "UK-2007-05", 105_896_555, 3_738_733_648, 2 * 3_738_733_648 + 105_896_555, 128, 32,
        "nodes and edges as quoted in the Plexus papers; " + _DERIVED
        + "; no features or labels: 128 random features and 32 degree-derived classes assumed, "
        "as for the paper's synthetic datasets", structure=_rmat_like("web graph"),
    ),
)

_BY_KEY = {info.name.lower(): info for info in _CATALOG}


def list_datasets() -> list[DatasetInfo]:
    """Every catalog entry, in catalog order."""
    return list(_CATALOG)


def get_dataset(name: str) -> DatasetInfo:
    """Catalog entry by name (case-insensitive); UserError lists the known names."""
    info = _BY_KEY.get(str(name).strip().lower())
    if info is None:
        known = ", ".join(d.name for d in _CATALOG)
        raise UserError(f"unknown dataset {name!r}; known datasets: {known} (or give the graph's sizes)",
                        parameter=("nodes", "nnz", "features", "classes"))
    return info


def workload_from_dataset(name: str, layers: int = 3, hidden: int = 128, bytes_per_element: int = 4) -> Workload:
    """Workload of a catalog dataset trained by a ``layers``-layer GCN of width ``hidden``."""
    info = get_dataset(name)
    return Workload.from_graph_stats(
        info.name, info.nodes, info.nnz, info.features, info.classes, layers=layers, hidden=hidden,
        bytes_per_element=bytes_per_element,
    )
