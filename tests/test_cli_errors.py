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
from shmlocks.cli import COMMANDS
from shmlocks.cli import bench as cli_bench
from shmlocks.cli import main as cli_main

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


NEEDS_A_NAME = {"inspect", "stat", "unlink"}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unknown_argument_is_the_commands_usage_error(command, capsys):
    """`shmlocks ls --bogus` is a mistake in `ls`: its usage line, not the top level's."""
    args = [command, *(["x"] if command in NEEDS_A_NAME else []), "--no-such-option"]
    with pytest.raises(SystemExit) as e:
        cli_main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith(f"usage: shmlocks {command} "), err
    assert f"shmlocks {command}: error: unrecognized arguments: --no-such-option" in err


def test_an_unknown_argument_before_the_command_is_the_top_levels(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["--no-such-option", "ls"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith("usage: shmlocks [-h]") and "unrecognized arguments" in err, err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_json_for_scripts(command, capsys):
    """A table for people, and --json for scripts: every command."""
    with pytest.raises(SystemExit) as e:
        cli_main([command, "--help"])
    assert e.value.code == 0
    assert "--json" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_bench_runs_from_any_directory_and_prints_json(tmp_path):
    """`shmlocks bench` finds the suite in the checkout it is installed from, whatever the
    current directory; --json prints results.json's object, the report going to stderr."""
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "shmlocks", "bench", "--smoke", "--json", "--out", str(out)]
        + ["--", "--locks", "futex", "--repeats", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["locks"] == ["futex", "multiprocessing.Lock"] and doc["problems"] == []
    assert json.loads((out / "results.json").read_text()) == doc
    assert "futex" in p.stderr  # the markdown report, for people


def test_bench_without_a_checkout_is_one_error(monkeypatch, capsys):
    """Installed from a wheel there is no bench/: one error line (exit status 1), and with
    --json the error object on stdout, as every command's."""
    monkeypatch.setattr(cli_bench, "_find_bench", lambda: None)
    assert cli_main(["bench", "--json"]) == 1
    io = capsys.readouterr()
    assert set(json.loads(io.out)) == {"error"}
    assert io.err.startswith("shmlocks: error: the benchmark suite (bench/run.py) is in the")
