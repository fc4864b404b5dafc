"""The type stubs match the compiled module (mypy.stubtest), so they cannot drift."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(120)
def test_stubtest():
    pytest.importorskip("mypy")
    allow = os.path.join(ROOT, ".ci", "stubtest-allowlist.txt")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "shmlocks._core", "--allowlist", allow],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
