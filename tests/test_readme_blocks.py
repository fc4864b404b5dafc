"""Every block of README.md that can be executed is, so that a stale fact fails here rather
than a newcomer: the command-line table against the parser (every command, every option),
every shell and console command line against the parser, the console output against a
real run of the same scene (its shape: numbers, widths and names aside), the Python
snippets run (with a unique name for "myapp"), the quoted example verbatim. The ls and
inspect example and the first Python example have their own tests in test_readme.py."""

from __future__ import annotations

import ast
import multiprocessing as mp
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest
from support import shm_exists, uniq

import shmlocks
from shmlocks.cli import build_parser

pytestmark = pytest.mark.timeout(90)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "README.md")) as _f:
    README = _f.read()


def blocks(lang: str) -> list[str]:
    """The README's fenced blocks of one language, in order."""
    return [m.group(1) for m in re.finditer(rf"```{lang}\n(.*?)```", README, re.S)]


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def _subcommands() -> dict[str, set[str]]:
    """{command: its long options} from the real parser (--help aside)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    out: dict[str, set[str]] = {}
    for name, p in sub.choices.items():  # type: ignore[union-attr]
        out[name] = {
            o
            for a in p._actions
            if a.help != "==SUPPRESS=="
            for o in a.option_strings
            if o.startswith("--") and o != "--help"
        }
    return out


def _table_rows() -> dict[str, str]:
    """{command: the synopsis in its first cell} of the Command line table."""
    rows = {}
    for line in section("Command line").splitlines():
        m = re.match(r"\| `([a-z]+)((?:[^`]|\\`)*)` \|", line)
        if m:
            rows[m.group(1)] = m.group(2).replace("\\|", "|")
    return rows


def test_the_command_table_lists_every_command_and_every_option():
    real = _subcommands()
    rows = _table_rows()
    assert set(rows) == set(real), "commands missing from, or stale in, the README table"
    for command, options in real.items():
        shown = set(re.findall(r"--[a-z][a-z-]*", rows[command]))
        assert shown == options, (
            f"{command}: README shows {sorted(shown)}, it has {sorted(options)}"
        )


def _parses(argv: list[str]) -> None:
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"`shmlocks {shlex.join(argv)}` from the README does not parse ({e.code})")


def test_every_command_line_the_readme_shows_parses():
    lines = [
        ln[2:].split()[1:]
        for b in blocks("console")
        for ln in b.splitlines()
        if ln.startswith("$ shmlocks ")
    ]
    for b in blocks("sh") + [README]:
        for m in re.finditer(r"python -m shmlocks((?: [a-z-]+)*)", b):
            lines.append(m.group(1).split())
    assert len(lines) >= 6
    for argv in lines:
        if argv:
            _parses(argv)


def test_the_install_and_test_commands_name_real_extras():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    named = re.findall(r"pip install -e '\.\[([a-z,]+)\]'", README)
    assert "test" in named
    for group in named:
        for extra in group.split(","):
            assert extra in extras, f"README installs the extra {extra!r}, which does not exist"
    (install,) = [b for b in blocks("sh") if "shmlocks demo" in b]
    assert install.strip() == "python -m pip install -e . && python -m shmlocks demo"
    plugin = {o for o in re.findall(r"`(--shmlocks-[a-z-]+)`", README)}
    from shmlocks import pytest_plugin  # every option the README gives the plugin exists

    src = open(pytest_plugin.__file__).read()
    for opt in plugin:
        assert f'"{opt}"' in src, opt
    assert "not available" not in README


def test_the_recovery_example_is_quoted_verbatim():
    (snippet,) = [b for b in blocks("python") if "def transfer(" in b]
    with open(os.path.join(ROOT, "examples", "test_transfer_recovery.py")) as f:
        example = f.read()
    for chunk in snippet.strip().split("\n\n\n"):
        assert chunk in example, f"README's quote differs from the example:\n{chunk}"


def _run(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )


def test_the_attach_by_name_snippet_runs():
    """Run in two programs, the snippet gives both the same lock, and the last one's end
    leaves nothing in /dev/shm."""
    (snippet,) = [b for b in blocks("python") if "open_or_create(" in b and "# in each" in b]
    name = uniq("readme-attach")
    code = snippet.replace('"myapp-jobs"', repr(name))
    other = f"import os, shmlocks\n{code}\nprint(os.stat('/dev/shm/' + lock.name).st_ino)\n"
    script = (
        f"import os, subprocess, sys, shmlocks\n{code}\n"
        "ino = os.stat('/dev/shm/' + lock.name).st_ino\n"
        f"out = subprocess.run([sys.executable, '-c', {other!r}], capture_output=True,"
        " text=True, check=True).stdout\n"
        "assert int(out) == ino, (out, ino)\n"
        "with lock:\n    pass\n"
    )
    r = _run(script)
    assert r.returncode == 0, r.stderr
    assert not shm_exists(name), "a normal end leaves nothing in /dev/shm"


def test_the_sharding_pool_example_runs_and_loses_no_update():
    """The Sharding section's Pool example, as a script: its printed total, and nothing
    left in /dev/shm by its table."""
    (snippet,) = [b for b in blocks("python") if "LockTable(64" in b and "mp.Pool" in b]
    script = snippet.replace(
        '    table = shmlocks.LockTable(64, "futex")',
        '    table = shmlocks.LockTable(64, "futex", name=sys.argv[1])',
    )
    assert script != snippet
    name = uniq("readme-table")
    r = subprocess.run(
        [sys.executable, "-c", "import sys\n" + script, name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["160000"]
    assert not shm_exists(name)


def test_the_sharding_hold_snippet_runs():
    """The hold() and hold_all() lines of the Sharding section run as written (the async
    line inside a coroutine), with the names they use defined."""
    (snippet,) = [b for b in blocks("python") if 'table.hold("alice", "bob"' in b]
    sync = [ln for ln in snippet.splitlines() if not ln.startswith("async with")]
    (aline,) = [ln for ln in snippet.splitlines() if ln.startswith("async with")]
    script = (
        "import asyncio, shmlocks\n"
        "table = shmlocks.LockTable(16)\n"
        "other_table = shmlocks.LockTable(4, 'mcs')\n"
        "jobs_lock = shmlocks.FutexMutex()\n"
        "accounts = {'alice': 100, 'bob': 0}\n"
        "def repair(a):\n    raise AssertionError('no owner died')\n"
        + "\n".join(sync)
        + "\nasync def main():\n    "
        + aline
        + "\nasyncio.run(main())\n"
        "assert accounts == {'alice': 90, 'bob': 10}, accounts\n"
        "assert not any(lk.locked() for lk in table)\n"
        "print('ok')\n"
    )
    r = _run(script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok"]


def test_the_owner_died_snippet_runs_after_a_holder_is_killed():
    (snippet,) = [b for b in blocks("python") if "repair(shared_data)" in b]
    script = (
        textwrap.dedent(
            """
            import shmlocks
            from shmlocks.testing import kill_while_holding
            shared_data = []
            def repair(d): d.append("repaired")
            def update(d): d.append("updated")
            def hold(lock):
                lock.acquire()
            lock = shmlocks.RobustMutex()
            kill_while_holding(lock, hold, lock)
            """
        )
        + snippet
        + "assert shared_data == ['repaired', 'updated'], shared_data\n"
        + "lock.acquire(); assert not lock.owner_died; lock.release(); lock.close()\n"
    )
    r = _run(script)
    assert r.returncode == 0, r.stderr


def test_the_region_snippet_runs():
    (snippet,) = [b for b in blocks("python") if "Region.create(" in b and "create_lock" in b]
    name = uniq("readme-region")
    code = snippet.replace('"myapp"', repr(name))
    m = re.search(r"# elsewhere: (.*) returns an (\w+)", code)
    assert m, "the snippet says what opening it elsewhere gives"
    body = code.split("    ...")[0]
    check = f"    assert type({m.group(1)}) is shmlocks.{m.group(2)}\n"
    r = _run("import shmlocks\n" + body + check)
    assert r.returncode == 0, r.stderr
    assert not shm_exists(name)


def test_the_stats_snippet_runs_and_its_keys_are_the_real_ones():
    (snippet,) = [b for b in blocks("python") if "lock.stats()" in b and "reset_stats" in b]
    shown = ast.literal_eval(
        "".join(ln.lstrip("# ") for ln in snippet.splitlines() if ln.startswith("# "))
    )
    code = (
        "import shmlocks\n"
        "region = shmlocks.Region.create(max_locks=2)\n"
        "lock = region.create_lock('jobs', 'futex')\n"
        "with lock:\n    pass\n"
        f"assert sorted(lock.stats()) == {sorted(shown)!r}, sorted(lock.stats())\n"
        + snippet
        + "assert lock.stats()['acquisitions'] == 0\n"
        + "assert list(region.stats()) == ['jobs']\n"
        + "region.close()\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------ console output shapes


def _shape(line: str, name: str) -> list[str]:
    line = line.replace(name, "REGION")
    return re.sub(r"\d+(\.\d+)?", "N", line).split()


def _console(command: str) -> list[str]:
    """The output lines the README shows under `$ shmlocks COMMAND ...`."""
    for b in blocks("console"):
        lines = b.splitlines()
        for i, ln in enumerate(lines):
            if ln.startswith(f"$ shmlocks {command}"):
                out = []
                for nxt in lines[i + 1 :]:
                    if nxt.startswith("$ "):
                        break
                    out.append(nxt)
                return out
    raise AssertionError(f"no `$ shmlocks {command}` in the README")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shmlocks", *args], capture_output=True, text=True, timeout=60
    )


def test_stat_and_top_show_the_readmes_columns(new_region):
    region = new_region(max_locks=16)
    for lock_name, kind in (("jobs", "mcs"), ("cache", "robust"), ("stats", "futex")):
        with region.create_lock(lock_name, kind):
            pass
    shown = _console("stat")
    real = _cli("stat", region.name)
    assert real.returncode == 0, real.stderr
    lines = real.stdout.splitlines()
    assert _shape(lines[0], region.name) == _shape(shown[0], "myapp")
    assert lines[1].split() == shown[1].split(), "the stat table's columns"
    assert [ln.split()[:2] for ln in lines[2:]] == [ln.split()[:2] for ln in shown[2:]]
    top_shown = _console("top")
    header = next(ln for ln in top_shown if ln.startswith("SEGMENT"))
    real = _cli("top", region.name, "--interval", "0.05")
    assert real.returncode == 0, real.stderr
    assert real.stdout.splitlines()[0].split() == header.split(), "the top table's columns"
    rows = [ln.split()[:3] for ln in top_shown if ln.startswith("myapp ")]
    got = [ln.split()[:3] for ln in real.stdout.splitlines()[1:]]
    assert sorted(got) == sorted([region.name, *r[1:]] for r in rows)


def _hold_then_want(region_name, first, then, ready, go):
    shmlocks.set_deadlock_timeout(None)  # wait forever: the cycle is the scene
    r = shmlocks.Region.open(region_name)
    a, b = r.open_lock(first), r.open_lock(then)
    a.acquire()
    ready.set()
    go.wait(30)
    b.acquire(timeout=60)


def test_deadlocks_shows_the_readmes_cycle(new_region):
    region = new_region(max_locks=4)
    region.create_lock("jobs", "mcs")
    region.create_lock("cache", "futex")
    ctx = mp.get_context("fork")
    go = ctx.Event()
    procs = []
    try:
        for first, then in (("jobs", "cache"), ("cache", "jobs")):
            ready = ctx.Event()
            procs.append(
                ctx.Process(target=_hold_then_want, args=(region.name, first, then, ready, go))
            )
            procs[-1].start()
            assert ready.wait(20)
            time.sleep(0.05)  # the README's rows are in the order the waits began
        go.set()
        deadline = time.monotonic() + 20
        while True:
            real = _cli("deadlocks")
            cycles = real.stdout.split("deadlock ")
            ours = [c for c in cycles if f"{region.name}/jobs" in c]
            if ours or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert real.returncode == 3, real.stdout + real.stderr
        assert ours, real.stdout
        got = ("deadlock " + ours[0]).rstrip("\n").splitlines()
        shown = _console("deadlocks")
        assert [_shape(ln, region.name) for ln in got] == [
            _shape(ln, "myapp") for ln in shown if ln.strip()
        ], "\n".join(got)
    finally:
        for p in procs:
            p.kill()
            p.join(10)


def test_the_owner_death_figures_in_the_text_are_the_tables():
    """ "Which lock should I use?" quotes the benchmark table's owner-death column (it once
    said 0.2 ms for robust beside a table giving 1.7 ms)."""
    rows = [
        ln.split("|")
        for ln in section("Benchmarks").splitlines()
        if ln.startswith("| ") and ln.split("|")[1].strip() in shmlocks.KINDS
    ]
    assert len(rows) == len(shmlocks.KINDS)
    ms = sorted(float(r[-2].strip().removesuffix(" ms")) for r in rows)
    advice = section("The lock kinds")
    assert f"{ms[0]}-{ms[-1]} ms after the holder's SIGKILL" in advice
    assert "0.2 ms" not in advice
