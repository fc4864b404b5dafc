"""Linters as tests: ruff over the whole repository, mypy over the package."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff():
    if shutil.which("ruff"):
        return ["ruff"]
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    return None


@pytest.mark.timeout(60)
def test_ruff_check():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed")
    proc = subprocess.run(
        [*ruff, "check", "--no-cache", ROOT], capture_output=True, text=True, timeout=50, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(60)
def test_ruff_format():
    """The repository is formatted as `ruff format` would (checked, never rewritten)."""
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed")
    proc = subprocess.run(
        [*ruff, "format", "--check", "--no-cache", ROOT],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(180)
def test_mypy_package():
    """The package's Python modules type-check against the stubs of the compiled core."""
    pytest.importorskip("mypy")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull, "shmlocks"],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
