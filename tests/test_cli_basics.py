import subprocess
import sys

from plexus_tune.cli import main


def test_version_prints_and_exits_zero(capsys):
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert "plexus-tune" in capsys.readouterr().out


def test_unknown_command_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "plexus_tune", "no-such-command"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "Traceback" not in proc.stderr
