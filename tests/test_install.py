"""What an install gives a user outside the checkout: a traceback into the compiled core
shows its source lines, from any directory (not "???"), editable install or not."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAILING = """\
import shmlocks


def test_into_the_core():
    shmlocks.Region.open("shmlt-no-such-segment-anywhere")
"""


@pytest.mark.timeout(60)
def test_a_traceback_into_the_core_shows_its_source_from_anywhere(tmp_path):
    """Cython names each source of the core relative to the folder that holds the package
    (shmlocks/_ext/base/region.pxi); pytest looks for it along sys.path. The editable
    install puts the checkout there (a path, not an import hook), so the lines show from
    any directory, not only from the checkout's root."""
    (tmp_path / "test_tb.py").write_text(FAILING)
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_tb.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert p.returncode == 1, p.stdout + p.stderr  # the one test failed, as written
    assert "shmlocks/_ext/base/region.pxi:" in p.stdout, p.stdout
    assert 'raise FileNotFoundError(f"no shared-memory segment named' in p.stdout, p.stdout
    assert "???" not in p.stdout, p.stdout


def test_the_cython_sources_ship_in_the_package():
    """An installed (non-editable) copy has the sources its tracebacks name: pyproject's
    package data covers every Cython source of the core."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        patterns = tomllib.load(f)["tool"]["setuptools"]["package-data"]["shmlocks"]
    pkg = ROOT / "shmlocks"
    shipped = {p for pat in patterns for p in pkg.glob(pat)}
    sources = {p for ext in ("pyx", "pxi", "pxd") for p in pkg.rglob(f"*.{ext}")}
    assert sources and not sources - shipped, sorted(
        os.path.relpath(p, ROOT) for p in sources - shipped
    )
