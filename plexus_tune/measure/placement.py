"""Where a launch's ranks ran, as run and collective record fields (docs/records.md)."""

from __future__ import annotations

from plexus_tune.launch.launchers import check_placement


def placement_fields(placement: list[dict], ranks_per_node: int | None) -> dict:
    """``rank_nodes``, ``hosts`` (per node index) and ``placement_ok`` of a launch's ranks.

    ``placement`` holds one report per rank (:func:`plexus_tune.launch.worker.rank_placement`).
    """
    checked = check_placement(placement, ranks_per_node or len(placement))
    hosts: dict = {}
    for node, host in zip(checked["rank_nodes"], checked["rank_hosts"]):
        hosts.setdefault(node, host)
    fields = {"rank_nodes": checked["rank_nodes"], "hosts": [hosts[k] for k in sorted(hosts, key=str)],
              "placement_ok": checked["placement_ok"]}
    first = placement[0] if placement else {}
    if first.get("slurm_job_id"):
        fields["slurm"] = {"job_id": first["slurm_job_id"], "step_id": first.get("slurm_step_id")}
    return fields
