"""README's `ls` / `inspect` example stays true: the same scene is built for real and the
command's output must have the README's shape (numbers, column widths and the region's
name aside), so a change of output or of the layout version shows up here."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from support import uniq

import shmlocks
from shmlocks.testing import kill_while_holding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_console() -> dict[str, list[str]]:
    """The README's first console block, split by command: {"ls": lines, "inspect": ...}."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    block = text.split("```console\n", 1)[1].split("```", 1)[0]
    out: dict[str, list[str]] = {}
    cur = None
    for line in block.splitlines():
        if line.startswith("$ shmlocks "):
            cur = line.split()[2]
            out[cur] = []
        elif cur:
            out[cur].append(line)
    return out


def _shape(line: str, name: str) -> str:
    line = line.replace(name, "REGION")
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return " ".join(line.split())


def _hold(region_name, lock_name, ready) -> None:
    lock = shmlocks.Region.open(region_name).open_lock(lock_name)
    lock.acquire()
    ready.set()
    time.sleep(60)


def _wait(region_name) -> None:
    shmlocks.Region.open(region_name).open_lock("jobs").acquire(timeout=30)


@pytest.mark.timeout(60)
def test_readme_inspect_example_matches_a_real_run():
    readme = _readme_console()
    name = uniq("readme")
    region = shmlocks.Region.create(name, max_locks=16)
    ctx = mp.get_context("fork")
    procs = []
    try:
        for lock_name, kind in (("jobs", "mcs"), ("cache", "robust"), ("stats", "futex")):
            region.create_lock(lock_name, kind)
        ready = ctx.Event()
        procs.append(ctx.Process(target=_hold, args=(name, "jobs", ready)))
        procs[-1].start()
        assert ready.wait(20)
        procs.append(ctx.Process(target=_wait, args=(name,)))
        procs[-1].start()
        time.sleep(0.3)
        ready = ctx.Event()
        dead = ctx.Process(target=_hold, args=(name, "cache", ready))
        dead.start()
        assert ready.wait(20)
        os.kill(dead.pid, signal.SIGKILL)
        dead.join(10)

        def run(*args):
            return subprocess.run(
                [sys.executable, "-m", "shmlocks", *args],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.splitlines()

        real = run("inspect", name)
        assert [_shape(ln, name) for ln in real] == [
            _shape(ln, "myapp") for ln in readme["inspect"]
        ], "\n".join(real)
        # (the shape masks numbers: the layout version is compared as itself, both sides)
        assert f"layout version {shmlocks.LAYOUT_VERSION}," in real[0]
        assert f"layout version {shmlocks.LAYOUT_VERSION}," in readme["inspect"][0]
        ls = run("ls")
        row = next(ln for ln in ls if ln.split()[:1] == [name])
        assert _shape(ls[0], name) == _shape(readme["ls"][0], "myapp")
        assert _shape(row, name) == _shape(readme["ls"][1], "myapp"), row
    finally:
        for p in procs:
            p.kill()
            p.join(10)
        region.close()


@pytest.mark.timeout(60)
def test_readme_usage_example_runs_as_printed(tmp_path):
    """README's first Python example, run as a script: it prints 40000, exactly, and
    leaves no segment behind."""
    with open(os.path.join(ROOT, "README.md")) as f:
        code = f.read().split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "usage.py"
    script.write_text(code)
    p = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = p.communicate(timeout=50)
    assert p.returncode == 0, err
    assert out.strip() == "40000"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"shmlocks-{p.pid}-")]


def _take(lock) -> None:
    assert lock.acquire(timeout=10)
    time.sleep(30)  # SIGKILLed as soon as it holds the lock


@pytest.mark.timeout(60)
def test_readme_usage_example_survives_a_worker_killed_holding_the_lock():
    """README's first example, as written, is death-safe: after a worker is SIGKILLed
    holding the lock, the others' work() finishes with every count (without its
    owner_died lines, the first release makes the lock unrecoverable for all of them)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        code = f.read().split("```python\n", 1)[1].split("```", 1)[0]
    ns: dict = {"__name__": "readme_usage"}  # defines work(); its __main__ part is skipped
    exec(compile(code, "README.md", "exec"), ns)
    ctx = mp.get_context("fork")
    lock = shmlocks.MCSLock(uniq("readme-kill"))
    procs: list = []
    try:
        kill_while_holding(lock, _take, lock, start_method="fork", timeout=20)
        counter = ctx.RawValue("q", 0)
        procs = [ctx.Process(target=ns["work"], args=(lock, counter)) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(40)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        assert counter.value == 30_000
        assert not lock.locked()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        lock.close()
