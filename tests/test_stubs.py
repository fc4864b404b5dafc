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


# A user's file, checked as a user checks it: threading.Condition on a lock and on an RLock
# (both work), and create_lock typed by the class given or named. assert_type fails the
# check if a type is wider than stated.
USER_FILE = """\
import threading
from typing import assert_type

import shmlocks


def use(region: shmlocks.Region) -> None:
    cond = threading.Condition(shmlocks.TicketLock())
    rcond = threading.Condition(shmlocks.RLock())
    assert_type(region.create_lock("a", shmlocks.RobustMutex), shmlocks.RobustMutex)
    assert_type(region.create_lock("b", shmlocks.PIMutex), shmlocks.PIMutex)
    assert_type(region.create_lock("c", "mcs"), shmlocks.MCSLock)
    assert_type(region.create_lock("d", "robust"), shmlocks.RobustMutex)
    assert_type(region.open_lock("a"), shmlocks.Lock)
    with region.create_lock("e", "ticket") as held:
        assert_type(held, shmlocks.TicketLock)
        assert_type(held.owner, tuple[int, int] | None)
    with cond, rcond:
        cond.notify_all()
        rcond.notify_all()
"""


def _mypy_strict(tmp_path, env_extra):
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(USER_FILE)
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", os.devnull]
        + ["user.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout: shmlocks is found where the install put it
        env=env,
        timeout=110,
    )


@pytest.mark.timeout(120)
def test_a_type_checker_finds_the_installed_package(tmp_path):
    """After README's `pip install -e .` a type checker, which cannot run an import hook,
    finds shmlocks (the editable install is a path: pyproject.toml's package-dir), and a
    user's --strict check of code that works passes."""
    proc = _mypy_strict(tmp_path, {})
    assert proc.returncode == 0, (
        proc.stdout[-4000:] + proc.stderr[-2000:] + "\n(an older editable install of this tree "
        "is an import hook that mypy cannot follow: `python -m pip install -e .` again)"
    )


@pytest.mark.timeout(120)
def test_the_package_itself_passes_a_strict_check(tmp_path):
    """With the tree given as the search path, mypy reports the errors of the modules the
    user's file imports (an installed package's are hidden): none, under --strict (no
    unused `type: ignore`, nothing untyped)."""
    proc = _mypy_strict(tmp_path, {"MYPYPATH": ROOT})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
