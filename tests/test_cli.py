import subprocess
import sys

from nmtkit import __version__


def test_version(run_cli):
    r = run_cli("--version")
    assert r.code == 0
    assert r.out.strip() == f"nmtkit {__version__}"


def test_unknown_flag_is_one_line_exit_2(run_cli):
    r = run_cli("--no-such-flag")
    assert r.code == 2
    lines = [l for l in r.err.splitlines() if l.strip()]
    assert len(lines) == 1 and "--no-such-flag" in lines[0]
    assert "Traceback" not in r.err


def test_python_m_nmtkit_runs():
    r = subprocess.run([sys.executable, "-m", "nmtkit", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and __version__ in r.stdout
