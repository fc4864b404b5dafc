"""/dev/shm is untrusted input (shmlocks/_shmread.py): a FIFO, a symlink, a directory, another
user's file or a segment that shrinks while it is read must never hang or kill a waiter's
deadlock look, the listing or a CLI command.

Every attack here is a file in /dev/shm, so each scenario runs in a child process with a
private, empty tmpfs on /dev/shm (tests/support/privshm.py; root only): nobody else's
/dev/shm sees the hostile file. Each child prints one JSON object that the test checks.
"""

from __future__ import annotations

import json

import pytest
from support.privshm import requires_private_shm, run_private

pytestmark = [pytest.mark.timeout(180), requires_private_shm]

# shared by the children: run a CLI command with a bound, report (rc, seconds, stderr)
PRELUDE = r"""
import json, os, signal, subprocess, sys, threading, time
import shmlocks

def cli(*args, env=None, timeout=15):
    t = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "shmlocks", *args], capture_output=True,
                           text=True, timeout=timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = "hung", "", ""
    return {"rc": rc, "s": round(time.monotonic() - t, 2), "out": out, "err": err.strip()}

out = {}
"""


FIFO = (
    PRELUDE
    + r"""
FIFO = "/dev/shm/adv-fifo"
os.mkfifo(FIFO)
fired = []
def unblock_after(seconds):
    # a reader stuck in open() of the FIFO is released by a writer's open
    time.sleep(seconds)
    fired.append(time.monotonic())
    try:
        os.close(os.open(FIFO, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass
threading.Thread(target=unblock_after, args=(60,), daemon=True).start()
t = time.monotonic()
out["is_region_file"] = shmlocks.is_region_file(FIFO)
out["list_regions"] = shmlocks.list_regions()
out["listing_s"] = round(time.monotonic() - t, 2)
for cmd in (["ls"], ["deadlocks"], ["top", "--json"], ["inspect", "adv-fifo"],
            ["stat", "adv-fifo"], ["unlink", "adv-fifo"]):
    out[" ".join(cmd)] = cli(*cmd)
shmlocks.set_deadlock_timeout(0.05)   # a wait walks its chain: never /dev/shm
acq = {}
for kind in shmlocks.KINDS:
    lk = shmlocks.KINDS[kind].create("adv-fifo-" + kind)
    held, done = threading.Event(), threading.Event()
    def hold():
        with lk:
            held.set()
            done.wait(30)
    th = threading.Thread(target=hold)
    th.start()
    held.wait()
    t = time.monotonic()
    got = lk.acquire(timeout=1.0)
    acq[kind] = [got, round(time.monotonic() - t, 2)]
    done.set()
    th.join()
    lk.close()
out["acquire"] = acq
out["watchdog_fired"] = bool(fired)
print(json.dumps(out))
"""
)


def test_a_fifo_in_dev_shm_hangs_nothing():
    """A FIFO in /dev/shm (any user can make one) was opened by every listing: the deadlock
    look of a wait past the deadlock timeout, ``ls``, ``deadlocks``, ``top``, ``inspect``
    blocked in open() until a writer came (forever). Now it is never opened by the
    listing, and naming it is a one-line error."""
    r = run_private(FIFO, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["watchdog_fired"] is False
    assert out["is_region_file"] is False and out["list_regions"] == []
    assert out["listing_s"] < 1
    for cmd in ("ls", "deadlocks", "top --json"):
        assert out[cmd]["rc"] == 0 and out[cmd]["s"] < 8, (cmd, out[cmd])
    for cmd in ("inspect adv-fifo", "stat adv-fifo", "unlink adv-fifo"):
        res = out[cmd]
        assert res["rc"] == 1 and res["s"] < 8, (cmd, res)
        assert res["err"] == (
            "shmlocks: error: 'adv-fifo': refused, not a regular file (a FIFO)"
        ), (cmd, res)
    for kind, (got, seconds) in out["acquire"].items():
        assert got is False and 0.9 <= seconds < 3.0, (kind, got, seconds)


ODD_ENTRIES = (
    PRELUDE
    + r"""
import pwd, shutil, socket
nobody = pwd.getpwnam("nobody")
real = shmlocks.Region.create("adv-real", max_locks=4, max_participants=8)
lk = real.create_lock("jobs", "mcs")
lk.acquire()
data = open("/dev/shm/adv-real", "rb").read()
os.symlink("/dev/shm/adv-real", "/dev/shm/adv-link")
os.mkfifo("/dev/shm/adv-fifo")
os.symlink("/dev/shm/adv-fifo", "/dev/shm/adv-link-fifo")
os.mkdir("/dev/shm/adv-dir")
s = socket.socket(socket.AF_UNIX)
s.bind("/dev/shm/adv-sock")
with open("/dev/shm/adv-foreign", "wb") as f:     # a copy of a real segment ...
    f.write(data)
os.chown("/dev/shm/adv-foreign", nobody.pw_uid, nobody.pw_gid)   # ... of another user
os.chmod("/dev/shm/adv-foreign", 0o666)
with open("/dev/shm/adv-short", "wb") as f:       # a segment cut short
    f.write(data[:4096])
out["list_regions"] = shmlocks.list_regions()
out["ls"] = cli("ls", "--json")
for name in ("adv-link", "adv-link-fifo", "adv-dir", "adv-sock", "adv-foreign", "adv-real",
             "adv-short"):
    out["inspect " + name] = cli("inspect", name)
out["deadlocks"] = cli("deadlocks", "--json")
trust = dict(os.environ, SHMLOCKS_TRUST_UIDS="nobody")
out["trusted ls"] = cli("ls", "--json", env=trust)
out["trusted inspect"] = cli("inspect", "adv-foreign", "--json", env=trust)
lk.release()
real.close()
print(json.dumps(out))
"""
)


def test_symlinks_directories_sockets_and_other_users_files_are_refused():
    """Only regular files owned by a trusted user (ours, root, SHMLOCKS_TRUST_UIDS) are
    read: a symlink (to a segment, or to a FIFO), a directory, a socket and a copy of a
    segment owned by another user are left out of every listing (the latter with a note)
    and are a one-line error when named; SHMLOCKS_TRUST_UIDS widens the trust."""
    r = run_private(ODD_ENTRIES, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["list_regions"] == ["adv-real", "adv-short"]
    ls = out["ls"]
    rows = json.loads(ls["out"])
    assert ls["rc"] == 0 and [x["name"] for x in rows] == ["adv-real", "adv-short"], ls
    assert "does not match its layout" in rows[1]["error"], rows
    assert "note: skipped adv-foreign: owned by uid" in ls["err"], ls
    why = {
        "adv-link": "not a regular file (a symbolic link)",
        "adv-link-fifo": "not a regular file (a symbolic link)",
        "adv-dir": "not a regular file (a directory)",
        "adv-sock": "not a regular file (a socket)",
        "adv-foreign": "owned by uid ",
    }
    for name, text in why.items():
        res = out["inspect " + name]
        assert res["rc"] == 1 and res["s"] < 8, (name, res)
        assert res["err"].startswith(f"shmlocks: error: '{name}': refused, {text}"), (name, res)
        assert len(res["err"].splitlines()) == 1, res
    short = out["inspect adv-short"]
    assert short["rc"] == 1 and "does not match its layout" in short["err"], short
    assert len(short["err"].splitlines()) == 1, short
    assert out["inspect adv-real"]["rc"] == 0, out["inspect adv-real"]
    assert "jobs" in out["inspect adv-real"]["out"]
    dl = out["deadlocks"]
    assert dl["rc"] == 0 and any("adv-foreign" in n for n in json.loads(dl["out"])["skipped"])
    trusted = out["trusted ls"]
    names = [x["name"] for x in json.loads(trusted["out"])]
    assert names == ["adv-foreign", "adv-real", "adv-short"], trusted
    d = json.loads(out["trusted inspect"]["out"])
    assert [lk["name"] for lk in d["locks"]] == ["jobs"] and d["locks"][0]["locked"]


TRUNCATE = (
    PRELUDE
    + r"""
ROUNDS = int(sys.argv[1])
src = shmlocks.Region.create("adv-trunc-src", max_locks=8, max_participants=64)
for k in shmlocks.KINDS:
    src.create_lock(k, k)
full = os.path.getsize("/dev/shm/adv-trunc-src")
with open("/dev/shm/adv-trunc-src", "rb") as f, open("/dev/shm/adv-fake", "wb") as g:
    g.write(f.read())
src.close()
pid = os.fork()
if pid == 0:                      # shrink to one page and regrow, until killed
    try:
        while True:
            os.truncate("/dev/shm/adv-fake", 4096)
            time.sleep(0.0005)
            os.truncate("/dev/shm/adv-fake", full)
            time.sleep(0.002)
    finally:
        os._exit(0)
try:
    snap = ("import shmlocks.waitgraph as w, time\n"
            "t = time.monotonic(); n = 0\n"
            "while time.monotonic() - t < 3: w.snapshot(); n += 1\n"
            "print(n)")
    p = subprocess.run([sys.executable, "-c", snap], capture_output=True, text=True, timeout=60)
    out["snapshot"] = [p.returncode, p.stdout.strip(), p.stderr[-300:]]
    acq = ("import shmlocks, threading, time\n"
           "shmlocks.set_deadlock_timeout(0.05)\n"
           "lk = shmlocks.FutexMutex.create('adv-trunc-lock')\n"
           "ev = threading.Event()\n"
           "def h():\n"
           "    with lk:\n"
           "        ev.set(); time.sleep(5)\n"
           "threading.Thread(target=h, daemon=True).start(); ev.wait()\n"
           "t = time.monotonic()\n"
           "print(lk.acquire(timeout=3), round(time.monotonic() - t, 2))\n")
    p = subprocess.run([sys.executable, "-c", acq], capture_output=True, text=True, timeout=60)
    out["acquire"] = [p.returncode, p.stdout.strip(), p.stderr[-300:]]
    for cmd in (["deadlocks"], ["ls"], ["top", "--json"], ["inspect", "adv-fake"],
                ["stat", "adv-fake"]):
        rcs = {}
        for _ in range(ROUNDS):
            rc = cli(*cmd)["rc"]
            rcs[str(rc)] = rcs.get(str(rc), 0) + 1
        out[" ".join(cmd)] = rcs
finally:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(json.dumps(out))
"""
)


def test_a_segment_that_shrinks_while_it_is_read_kills_nobody():
    """A file that looks like a segment, shrunk and regrown in a loop by its owner: the
    scans mapped it, and a read past the new end was SIGBUS (exit -7) for a waiter's
    deadlock look (on an unrelated lock), ``deadlocks``, ``ls``, ``top``, ``inspect``,
    ``stat``. Now they read it with pread into a private copy: a short read is a note or
    a one-line error."""
    r = run_private(TRUNCATE, "8", timeout=170)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    rc, n, err = out["snapshot"]
    assert rc == 0 and int(n) > 0, out["snapshot"]
    rc, got, err = out["acquire"]
    assert rc == 0, out["acquire"]
    assert got.split()[0] == "False" and 2.9 <= float(got.split()[1]) < 5, out["acquire"]
    for cmd in ("deadlocks", "ls", "top --json", "inspect adv-fake", "stat adv-fake"):
        rcs = out[cmd]
        assert set(rcs) <= {"0", "1"}, (cmd, rcs)  # 1: "shrank while it was read"
        assert sum(rcs.values()) == 8
    for cmd in ("deadlocks", "ls", "top --json"):
        assert set(out[cmd]) == {"0"}, (cmd, out[cmd])
