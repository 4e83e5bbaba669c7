"""A graph read for the model (``predict --graph``): its workload and its shards' statistics.

:func:`read_graph_input` reads a shard directory's manifest and stored matrix, or loads a
graph file or synthetic spec (its pattern alone; a row sample where ``sample`` asks for
one, docs/model.md, "Sampled structure"), and returns a :class:`GraphInput`: the workload
and what :meth:`GraphInput.shards` and :meth:`GraphInput.permutation_gain` need to price
each grid's largest shard and its structure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from plexus_tune.errors import UserError
from plexus_tune.graph.cache import StructureCache
from plexus_tune.graph.structure import shard_directory_matrix
from plexus_tune.graph.structure_sample import auto_fraction, parse_sample, sampled_normalized_nnz
from plexus_tune.measure.campaign import load_graph_source
from plexus_tune.model.prediction import permutation_gain
from plexus_tune.model.sparsity import graph_sparsity, graph_summary
from plexus_tune.model.workload import Workload


@dataclass(frozen=True)
class GraphInput:
    """A graph the model reads: ``workload`` (N, normalized NNZ, widths), and either ``graph`` (the loaded
    graph's pattern) or ``stored`` (a shard directory's (matrix, manifest)); ``fraction`` the share of the
    entries a row sample reads (None: scanned whole), ``cache`` its structure cache (None: off or sampled)."""

    source: str
    workload: Workload
    graph: object = None
    stored: tuple | None = None
    fraction: float | None = None
    cache: StructureCache | None = None
    #: a sampled graph's permutations kept in the data directory (graph/permute.stored_inverse_permutations)
    store_permutations: bool = False

    @property
    def stored_permutation(self) -> str | None:
        """The permutation a shard directory was cut after (None for a graph)."""
        return None if self.stored is None else self.stored[1].get("permutation", {}).get("mode", "double")

    def shards(self, grids, layers: int, permute: str | None = None):
        """(GraphSparsity, permutation) of the graph's shards on ``grids``: a shard directory's as stored,
        a graph's after ``permute`` (default double; :func:`plexus_tune.model.sparsity.graph_sparsity`)."""
        if self.stored is not None:
            return graph_sparsity(self.stored[0], grids, layers, permute=self.stored_permutation, stored=True), \
                self.stored_permutation
        mode = permute or "double"
        return graph_sparsity(self.graph, grids, layers, permute=mode, cache=self.cache, sample=self.fraction,
                              store_permutations=self.store_permutations), mode

    def permutation_gain(self, machine, grid, modes, **settings) -> dict | None:
        """:func:`plexus_tune.model.prediction.permutation_gain` of the graph (None for stored shards)."""
        if self.graph is None:
            return None
        return permutation_gain(self.graph, self.workload, machine, grid, modes, cache=self.cache, sample=self.fraction,
                                store_permutations=self.store_permutations, **settings)


def read_graph_input(source: str, *, features: int | None = None, classes: int | None = None, sample="auto",
                     cache: bool = True, **sizes) -> GraphInput:
    """The :class:`GraphInput` of a shard directory, graph file or synthetic spec. ``features`` and
    ``classes`` override the graph's (a shard directory without node data needs them); ``sample``: a
    fraction of the entries to read, ``"auto"`` (:func:`plexus_tune.graph.structure_sample.auto_fraction`)
    or None (scan it all); ``cache``: use the structure cache; ``sizes``: layers, hidden, bytes_per_element."""
    if os.path.isdir(source) and os.path.isfile(os.path.join(source, "manifest.json")):
        matrix, manifest = shard_directory_matrix(source)
        node_data = manifest.get("node_data") or {}
        features = features or node_data.get("num_features")
        classes = classes or node_data.get("num_classes")
        if features is None or classes is None:
            raise UserError(f"{source} holds no node data: give the features and classes", parameter=("features", "classes"))
        workload = Workload.from_graph_stats(manifest.get("name", "shards"), int(manifest["num_nodes"]),
                                             int(manifest["nnz"]), features, classes, **sizes)
        return GraphInput(source, workload, stored=(matrix, manifest))
    sample = parse_sample(sample)
    # the model reads the pattern and widths alone; a sample reads some rows' indices, checked as read
    graph = load_graph_source(source, pattern_only="rows" if sample is not None else True)
    fraction = auto_fraction(graph.adjacency.nnz) if sample == "auto" else sample
    fraction = None if fraction is not None and fraction >= 1 else fraction
    if sample is not None and fraction is None:
        graph = load_graph_source(source, pattern_only=True)  # scanned whole: every index checked first
    structure = None
    if fraction is not None:
        nnz, _ = sampled_normalized_nnz(graph.adjacency, fraction)
    else:
        structure = StructureCache(graph) if cache else None
        nnz = graph_summary(graph, structure)["normalized_nnz"]
    workload = Workload.from_graph_stats(graph.name, graph.num_nodes, nnz, features or graph.num_features,
                                         classes or int(graph.num_classes), **sizes)
    return GraphInput(source, workload, graph=graph, fraction=fraction, cache=structure,
                      store_permutations=fraction is not None and cache)
