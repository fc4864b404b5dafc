"""Lock-order validation across processes (SHMLOCKS_LOCKDEP): process 1 takes A then B and
exits; process 2 taking B then A gets LockOrderError before it blocks, naming both orders
and where each was recorded. Warn mode, non-blocking acquires, a full graph, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import SHM_DIR, uniq
from support import run_lockdep
from support.privshm import requires_private_shm, run_private

import shmlocks

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def graph():
    """A graph file of this test's own, removed afterwards."""
    path = os.path.join(SHM_DIR, uniq("lockdep"))
    yield path
    if os.path.exists(path):
        os.unlink(path)


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
    r = run_lockdep(_ab(A_THEN_B, a, b), graph)
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
        r = run_lockdep(_ab(b_then_a, a, b), graph)
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
    assert run_lockdep(first, graph).returncode == 0
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
    r = run_lockdep(_ab(code, a, b), graph, mode="warn")
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
    r = run_lockdep(code, graph)
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
    r = run_lockdep(code, graph)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "None"]


def test_cli_lists_orders_and_reset_clears_them(graph, new_lock):
    a, b = new_lock("ticket"), new_lock("futex")
    assert run_lockdep(_ab(A_THEN_B, a, b), graph).returncode == 0
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
    r = run_lockdep(_ab(A_THEN_B, a, b), graph, mode=None)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(graph)
    assert shmlocks.LockOrderError.__mro__[1] is shmlocks.DeadlockError


def test_a_thread_that_reuses_an_ident_holds_nothing(graph, new_lock):
    """Thread idents are reused as soon as a thread ends. A thread that ends holding A (a
    thread death, recovered as owner death) must not leave A "held" by the next thread
    with its ident: that one takes only B, so no order A -> B exists, and B then A is no
    inversion (it was a false LockOrderError when the held classes were keyed by ident)."""
    a, b = new_lock("futex"), new_lock("futex")
    code = f"""
    import threading, time, shmlocks
    A, B = shmlocks.FutexMutex.open({a.name!r}), shmlocks.FutexMutex.open({b.name!r})
    idents = []
    def dies_holding_a():
        idents.append(threading.get_ident())
        A.acquire()                  # ends without releasing
    def takes_b_only():
        idents.append(threading.get_ident())
        with B:
            pass
    for f in (dies_holding_a, takes_b_only):
        t = threading.Thread(target=f)
        t.start()
        t.join()
        time.sleep(0.2)              # glibc caches the stack (and so the ident) once it exits
    print("reused" if idents[0] == idents[1] else "not reused")
    with B:
        try:
            A.acquire()
        except shmlocks.LockOrderError as e:
            print("LockOrderError", e)
        else:
            print("acquired, owner_died", A.owner_died)
            A.mark_consistent()
            A.release()
    """
    r = run_lockdep(code, graph)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "reused", "the scenario needs a reused ident (glibc reuses it)"
    assert lines[1:] == ["acquired, owner_died True"], r.stdout
    rep = json.loads(cli(graph, "--json").stdout)
    assert [(o["from"], o["to"]) for o in rep["orders"]] == [(b.name, a.name)]


FOREIGN_GRAPH = r"""
import json, os, pwd, stat, subprocess, sys
nobody = pwd.getpwnam("nobody")
path = f"/dev/shm/shmlocks-lockdep-{os.geteuid()}"
victim = '''
import shmlocks
A = shmlocks.FutexMutex.create("ldA"); B = shmlocks.FutexMutex.create("ldB")
with A:
    try:
        B.acquire(); B.release(); print("no error")
    except BaseException as e:
        print(type(e).__name__ + ":", str(e).splitlines()[0])
'''
def as_nobody(code):
    subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                    "--clear-groups", sys.executable, "-c", code], check=True)
planted = json.dumps({"kind": "order", "order": ["ldB", "ldA"], "file": "evil.py",
                      "line": 1, "function": "x", "pid": 1}) + "\n"
plant_file = (f"import os; fd = os.open({path!r}, os.O_CREAT | os.O_WRONLY, 0o666); "
              f"os.fchmod(fd, 0o666); os.write(fd, {planted.encode()!r}); os.close(fd)")
env = {k: v for k, v in os.environ.items() if k != "SHMLOCKS_LOCKDEP_GRAPH"}
env["SHMLOCKS_LOCKDEP"] = "1"
out = {}
for variant in ("nobody's file", "nobody's fifo", "our file, mode 666", "a symlink", "none"):
    if os.path.lexists(path):
        os.unlink(path)
    if variant == "nobody's file":
        as_nobody(plant_file)
    elif variant == "nobody's fifo":
        as_nobody(f"import os; os.mkfifo({path!r}, 0o666)")
    elif variant == "our file, mode 666":
        with open(path, "w") as f:
            f.write(planted)
        os.chmod(path, 0o666)
    elif variant == "a symlink":
        with open("/dev/shm/target", "w") as f:
            f.write(planted)
        os.symlink("/dev/shm/target", path)
    try:
        p = subprocess.run([sys.executable, "-c", victim], capture_output=True, text=True,
                           timeout=20, env=env)
        res = (p.stdout + p.stderr).strip()
    except subprocess.TimeoutExpired:
        res = "hung"
    st = os.lstat(path) if os.path.lexists(path) else None
    out[variant] = [res, None if st is None else [st.st_uid, stat.S_IMODE(st.st_mode)]]
print(json.dumps(out))
"""


@requires_private_shm
def test_a_graph_file_planted_by_someone_else_is_refused():
    """The graph's default path is predictable, in world-writable /dev/shm: a file another
    user made there first (or a FIFO, a symlink, a file others may write) is refused with
    a PermissionError naming it, never believed (an order planted there was a
    LockOrderError for an acquire nobody ever inverted) and never waited on (a FIFO); the
    file lockdep makes itself is exclusive, ours and mode 600."""
    r = run_private(FOREIGN_GRAPH)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    for variant in ("nobody's file", "nobody's fifo", "our file, mode 666"):
        res = out[variant][0]
        assert res.startswith(
            "PermissionError: lockdep graph /dev/shm/shmlocks-lockdep-0: refused"
        ), (variant, res)
    assert "owned by uid" in out["nobody's file"][0]
    assert "not a regular file" in out["nobody's fifo"][0]
    assert "writable by others" in out["our file, mode 666"][0]
    assert out["a symlink"][0].startswith("OSError: [Errno 40]"), out["a symlink"]  # ELOOP
    assert out["none"] == ["no error", [0, 0o600]], out["none"]
