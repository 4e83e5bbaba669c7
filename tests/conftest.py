import os

import pytest

from netns_token import prefix_for
from plexus_tune.cli import main


@pytest.fixture
def run_cli(capsys):
    """Run ``plexus-tune ARGS`` in process; returns (exit code, stdout, stderr)."""

    def run(argv):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(autouse=True, scope="session")
def _data_directory(tmp_path_factory):
    """Default logs and studies of the whole session (subprocesses too) go to a temporary directory."""
    previous = os.environ.get("PLEXUS_TUNE_DATA")
    os.environ["PLEXUS_TUNE_DATA"] = str(tmp_path_factory.mktemp("plexus-tune-data"))
    yield
    if previous is None:
        os.environ.pop("PLEXUS_TUNE_DATA", None)
    else:
        os.environ["PLEXUS_TUNE_DATA"] = previous


@pytest.fixture(autouse=True, scope="session")
def _namespace_prefix():
    """Emulated clusters of the session (subprocesses too) get a prefix of this run alone
    (tests/netns_token.py); what they leave behind is removed at the end."""
    from plexus_tune.cluster.emulated import PREFIX_ENV, cleanup_leftovers

    previous = os.environ.get(PREFIX_ENV)
    os.environ[PREFIX_ENV] = prefix = prefix_for("d")
    yield prefix
    if previous is None:
        os.environ.pop(PREFIX_ENV, None)
    else:
        os.environ[PREFIX_ENV] = previous
    cleanup_leftovers(grace_s=0, prefix=prefix)
