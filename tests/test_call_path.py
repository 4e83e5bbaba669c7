"""A run's configuration visits each module once from its spec to the store (docs/architecture.md, "Run identity").

``plexus-tune measure`` trains one run on one local rank, traced in this process
(:func:`plexus_tune.callpath.trace`); up to the record being appended to the log, the
modules the configuration enters are the path's, in call order, each entered once: a
module called again (a climb), a module left out or a new room on the path fails here.
"""

import pytest

from plexus_tune.callpath import Entry, climbs, module_order, short, trace, until
from plexus_tune.cli import main

#: The path from the command's spec to the logged record.
PATH = ["measure/identity", "trainer/algorithms", "measure/campaign", "measure/training", "trainer/run",
        "measure/records", "measure/store"]


def test_climbs_and_order_are_counted_by_hand():
    """The helpers on a path written out: a module entered again is one climb, listed again in the order."""
    entries = [Entry("plexus_tune.cli.measure", "plexus_tune.measure.identity", "from_args"),
               Entry("plexus_tune.measure.identity", "plexus_tune.trainer.algorithms", "normalize_config"),
               Entry("plexus_tune.cli.measure", "plexus_tune.measure.identity", "identity"),
               Entry("plexus_tune.measure.identity", "plexus_tune.measure.store", "append_records")]
    assert module_order(entries) == ["measure/identity", "trainer/algorithms", "measure/identity", "measure/store"]
    assert climbs(entries) == [entries[2]]
    assert until(entries, "normalize_config") == entries[:2] and until(entries, "nothing") == entries
    assert short("plexus_tune.measure.store") == "measure/store"


def test_measure_enters_each_module_once_from_the_spec_to_the_store(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    argv = ["measure", "--graph", "rmat:nodes=64,edges=256,features=4,classes=2,seed=0", "--gpus", "1",
            "--grids", "1x1x1", "--trials", "1", "--epochs", "2", "--warmup", "1", "--layers", "2", "--hidden", "4",
            "--machine", "cpu-gloo-2core", "--launcher", "local", "--log", str(log)]
    seen = trace(main, argv)
    assert seen.result == 0, capsys.readouterr().err
    assert log.read_text().count("\n") == 1  # one run logged
    path = until(seen.entries, "append_records")
    assert path[-1].function == "append_records" and short(path[-1].module) == "measure/store"
    assert module_order(path) == PATH
    assert climbs(path) == []
    assert seen.counts["normalize_config"] == 1  # the family's settings filled in once, in the spec
