import os

import pytest

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
