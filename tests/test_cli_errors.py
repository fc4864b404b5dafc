"""The command line's rough edges a newcomer meets first: argument errors that name the
option rather than an internal function, every error in one form (``shmlocks: error:
...`` on stderr, ``{"error": ...}`` on stdout with --json), and ``--version``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib

import pytest
from support import shm_remove, uniq

import shmlocks

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shmlocks", *args], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("top", "--interval", "abc"), "argument --interval: not a number of seconds: 'abc'"),
        (("demo", "--workers", "abc"), "argument --workers: not a whole number: 'abc'"),
        (("demo", "--handoff", "x"), "argument --handoff: not a number: 'x'"),
        (("torture", "--seconds", "x"), "argument --seconds: not a number: 'x'"),
    ],
)
def test_a_bad_option_value_is_named_without_internal_names(args, says):
    p = cli(*args)
    assert p.returncode == 2
    assert says in p.stderr, p.stderr
    assert "invalid" not in p.stderr and "_" not in p.stderr.splitlines()[-1].split(":", 1)[1]


@pytest.fixture
def truncated():
    """A file with a real segment's first page and not the rest (made at that size, never
    shrunk under anyone's mapping)."""
    name = uniq("trunc")
    region = shmlocks.Region.create(name=uniq("trunc-src"), max_locks=4)
    region.create_lock("a", "mcs")
    with open(f"/dev/shm/{region.name}", "rb") as f:
        head = f.read(4096)
    region.close()
    fd = os.open(f"/dev/shm/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, head)
    finally:
        os.close(fd)
    yield name
    shm_remove(name)


@pytest.mark.parametrize("command", ["inspect", "stat"])
def test_a_truncated_segment_is_one_error_line_like_the_others(truncated, command):
    p = cli(command, truncated)
    missing = cli(command, uniq("missing"))
    for proc in (p, missing):
        assert proc.returncode == 1
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("shmlocks: error: "), proc.stderr
    assert "Error:" not in p.stderr, "no exception class name before the message"
    assert truncated in p.stderr


@pytest.mark.parametrize("command", ["unlink", "inspect", "stat"])
def test_json_errors_are_json_on_stdout(command):
    name = uniq("missing")
    p = cli(command, name, "--json")
    assert p.returncode == 1
    err = json.loads(p.stdout)
    assert set(err) == {"error"} and name in err["error"], p.stdout
    assert p.stderr == f"shmlocks: error: {err['error']}\n"


def test_version_has_one_source():
    p = cli("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"shmlocks {shmlocks.__version__}"
    assert importlib.metadata.version("shmlocks") == shmlocks.__version__
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert "version" not in project and "version" in project["dynamic"]
