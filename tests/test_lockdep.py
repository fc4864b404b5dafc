"""Lock-order validation across processes (SHMLOCKS_LOCKDEP): process 1 takes A then B and
exits; process 2 taking B then A gets LockOrderError before it blocks, naming both orders
and where each was recorded. Warn mode, non-blocking acquires, a full graph, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import SHM_DIR, uniq

import shmlocks

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def graph():
    """A graph file of this test's own, removed afterwards."""
    path = os.path.join(SHM_DIR, uniq("lockdep"))
    yield path
    if os.path.exists(path):
        os.unlink(path)


def run(code, graph, mode="1", **extra):
    env = dict(os.environ, SHMLOCKS_LOCKDEP=mode, SHMLOCKS_LOCKDEP_GRAPH=graph, **extra)
    if mode is None:
        del env["SHMLOCKS_LOCKDEP"]
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def cli(graph, *args):
    env = dict(os.environ, SHMLOCKS_LOCKDEP_GRAPH=graph)
    return subprocess.run(
        [sys.executable, "-m", "shmlocks", "lockdep", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


A_THEN_B = """
import shmlocks, sys
a, b = shmlocks.TicketLock.open(sys.argv[1]), shmlocks.FutexMutex.open(sys.argv[2])
def take_a_then_b():
    with a:
        with b:
            pass
take_a_then_b()
"""


def _ab(code, a, b):
    return code.replace("sys.argv[1]", repr(a.name)).replace("sys.argv[2]", repr(b.name))


def test_an_inversion_across_processes_raises_before_blocking(graph, new_lock):
    a, b = new_lock("ticket"), new_lock("futex")
    r = run(_ab(A_THEN_B, a, b), graph)
    assert r.returncode == 0, r.stderr
    b_then_a = """
    import os, time, shmlocks, sys
    a, b = shmlocks.TicketLock.open(sys.argv[1]), shmlocks.FutexMutex.open(sys.argv[2])
    def take_b_then_a():
        with b:
            t0 = time.monotonic()
            try:
                a.acquire(timeout=5)
            except shmlocks.LockOrderError as e:
                assert isinstance(e, shmlocks.DeadlockError)
                assert time.monotonic() - t0 < 4, "refused before it waited"
                print(e)
                return
        raise SystemExit("no LockOrderError")
    take_b_then_a()
    """
    with a:  # a is held here: a wait for it would block, the error must come first
        r = run(_ab(b_then_a, a, b), graph)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert f"acquiring {a.name!r} while holding {b.name!r}" in out
    assert "take_b_then_a()" in out and "take_a_then_b()" in out
    assert f"{b.name} -> {a.name}: this acquire" in out
    assert f"{a.name} -> {b.name}: recorded at" in out
    assert out.count("<string>:") == 2 and "(pid " in out


def test_warn_mode_warns_and_goes_on(graph, new_lock):
    a, b = new_lock("mcs"), new_lock("clh")
    first = _ab(A_THEN_B, a, b).replace("TicketLock", "MCSLock").replace("FutexMutex", "CLHLock")
    assert run(first, graph).returncode == 0
    code = """
    import warnings, shmlocks, sys
    a, b = shmlocks.MCSLock.open(sys.argv[1]), shmlocks.CLHLock.open(sys.argv[2])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            with b:
                with a:
                    pass
    ws = [x for x in w if issubclass(x.category, shmlocks.LockOrderWarning)]
    print(len(ws), issubclass(shmlocks.LockOrderWarning, RuntimeWarning))
    """
    r = run(_ab(code, a, b), graph, mode="warn")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "True"], "warned once for the chain, the acquires went on"
    rep = json.loads(cli(graph, "--json").stdout)
    assert [(o["from"], o["to"]) for o in rep["orders"]] == [(a.name, b.name)]
    assert [(i["from"], i["to"]) for i in rep["inversions"]] == [(b.name, a.name)]


def test_a_non_blocking_acquire_records_no_order_but_counts_as_held(graph, new_lock):
    a, b, c = new_lock("futex"), new_lock("futex"), new_lock("futex")
    code = f"""
    import shmlocks
    a, b, c = (shmlocks.FutexMutex.open(n) for n in {[a.name, b.name, c.name]!r})
    assert a.acquire(blocking=False)
    assert b.acquire(blocking=False)     # no order a -> b
    with c:                              # orders a -> c and b -> c
        pass
    b.release(); a.release()
    """
    r = run(code, graph)
    assert r.returncode == 0, r.stderr
    rep = json.loads(cli(graph, "--json").stdout)
    assert sorted((o["from"], o["to"]) for o in rep["orders"]) == sorted(
        [(a.name, c.name), (b.name, c.name)]
    )


def test_a_full_graph_turns_validation_off_with_one_warning(graph, new_region):
    region = new_region(max_locks=8)
    for i in range(6):
        region.create_lock(f"l{i}", "ticket")
    code = f"""
    import warnings, shmlocks, shmlocks.lockdep as ld
    ld.MAX_ORDERS = 3
    r = shmlocks.Region.open({region.name!r})
    locks = [r.open_lock(f"l{{i}}") for i in range(6)]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for x, y in zip(locks, locks[1:]):
            with x:
                with y:
                    pass
        with locks[5]:
            with locks[0]:   # an inversion of 0 -> 1, not seen: validation is off
                pass
    print(len([x for x in w if "full" in str(x.message)]), ld.enabled())
    """
    r = run(code, graph)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "None"]


def test_cli_lists_orders_and_reset_clears_them(graph, new_lock):
    a, b = new_lock("ticket"), new_lock("futex")
    assert run(_ab(A_THEN_B, a, b), graph).returncode == 0
    r = cli(graph)
    assert r.returncode == 0
    row = next(ln for ln in r.stdout.splitlines() if a.name in ln)
    assert b.name in row and "take_a_then_b" in row
    assert "inversions found: 0" in r.stdout
    r = cli(graph, "--reset", "--json")
    assert json.loads(r.stdout)["reset"] is True and not os.path.exists(graph)
    assert json.loads(cli(graph, "--json").stdout)["orders"] == []


def test_lockdep_off_makes_no_graph(graph, new_lock):
    a, b = new_lock("ticket"), new_lock("futex")
    r = run(_ab(A_THEN_B, a, b), graph, mode=None)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(graph)
    assert shmlocks.LockOrderError.__mro__[1] is shmlocks.DeadlockError
