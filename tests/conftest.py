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
