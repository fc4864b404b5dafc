"""No glibc assert is reachable from the bytes of a segment (shm_sys.h, the pm_* guards).

Every glibc mutex of a region lives in the segment: the participants' liveness tokens, the
directory and repair mutexes, the robust and pi lock words. glibc assert()s (SIGABRT: the
interpreter dies) on states it could not have made itself: a ``__kind`` that is not the one
pthread_mutex_init wrote, a pi word naming a thread that does not exist. Each case runs in
a child interpreter on a copy of a real segment; a crash is the child killed by a signal.
"""

from __future__ import annotations

import os
import signal
import struct

import pytest
from support.common import run_python, shm_path, shm_remove, uniq

import shmlocks

HDR = struct.Struct("<QIIQIIQQQQ")  # magic .. lock_stride (shm_layout.h)
KIND_OFF = 16  # pthread_mutex_t.__data.__kind (x86_64 and aarch64 glibc)
TOKEN_STRIDE = shmlocks._core.LAYOUT["participant_size"]  # a participant: four lines


def _layout(data: bytes) -> dict[str, int]:
    (_m, _v, _ln, _t, nlocks, npart, dir_off, part_off, locks_off, stride) = HDR.unpack_from(data)
    return {"L": nlocks, "P": npart, "part": part_off, "locks": locks_off, "stride": stride}


def _run_on_copy(data: bytes, code: str, timeout: float = 60.0):
    """Write ``data`` as a new segment and run ``code`` on it in a child interpreter
    (``sys.argv[1]`` is the segment's name). The segment is removed afterwards."""
    name = uniq("glibc-copy")
    # A copy of a segment's bytes is a segment nobody holds: unless it is persistent,
    # open() takes it for one whose last user died, and removes it (README "Lifecycle").
    # Mark the copy persist (header.flags, byte 88: SHM_HDR_PERSIST), as a kept image is.
    data = bytearray(data)
    data[88] |= 1
    try:
        with open(shm_path(name), "wb") as f:
            f.write(data)
        return run_python(code, name, timeout=timeout)
    finally:
        shm_remove(name)


def _assert_no_crash(p) -> None:
    assert p.returncode >= 0, (
        f"child killed by {signal.Signals(-p.returncode).name}: {p.stderr.strip()[-400:]}"
    )
    assert p.returncode == 0, p.stderr.strip()[-600:]


# --------------------------------------------------------------------------- pi: ESRCH

_PI_CHILD = """
import sys, shmlocks
lk = shmlocks.PIMutex.open(sys.argv[1])
print("locked", lk.locked())
got = lk.acquire(timeout=2)
print("got", got, "owner_died", got and lk.owner_died)
if got:
    lk.mark_consistent()
    lk.release()
    print("again", lk.acquire(timeout=1))
    lk.release()
lk.close()
"""


def test_pi_copy_made_while_held_recovers_instead_of_abort():
    """A copy of a segment made while its pi lock was held names, in the futex word, a
    thread that exists in no process (the holder died; the kernel cleaned only the
    original). FUTEX_LOCK_PI would fail with ESRCH and glibc abort; the waiter instead
    finds the owner gone, as the kernel would have marked it, and recovers with
    owner_died. (Before: child exit -6, `e != ESRCH || !robust`.)"""
    name = uniq("glibc-pi")
    lk = shmlocks.PIMutex.create(name)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                c = shmlocks.PIMutex.open(name)
                c.acquire()
                with open(shm_path(name), "rb") as f:
                    os.write(w, b"x")
                    data = f.read()
                with open(shm_path(name) + "-copy", "wb") as g:
                    g.write(data)
            finally:
                os.kill(os.getpid(), signal.SIGKILL)
        os.close(w)
        os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        with open(shm_path(name) + "-copy", "rb") as f:
            data = f.read()
        os.unlink(shm_path(name) + "-copy")
        word = struct.unpack_from("<I", data, _layout(data)["locks"] + 128)[0]
        assert word & 0x3FFFFFFF == pid, "the copy's word names the dead holder"
        p = _run_on_copy(data, _PI_CHILD)
        _assert_no_crash(p)
        assert "got True owner_died True" in p.stdout, p.stdout
        assert "again True" in p.stdout
    finally:
        lk.close()


@pytest.mark.parametrize("died_bit", [0, 0x40000000], ids=["tid", "tid+owner_died"])
def test_pi_word_naming_no_thread_recovers(died_bit):
    """The same with a scribbled word: a TID no thread has (with or without the
    OWNER_DIED bit, which only the kernel's transient states carry with a TID)."""
    name = uniq("glibc-pi")
    lk = shmlocks.PIMutex.create(name)
    try:
        with open(shm_path(name), "rb") as f:
            data = bytearray(f.read())
        struct.pack_into("<I", data, _layout(data)["locks"] + 128, 0x3FFFFFF0 | died_bit)
        p = _run_on_copy(bytes(data), _PI_CHILD)
        _assert_no_crash(p)
        assert "got True owner_died True" in p.stdout, p.stdout
    finally:
        lk.close()


def _kernel_thread_tid() -> int | None:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[6]) & 0x00200000:  # PF_KTHREAD
                return int(d)
    return None


def test_pi_word_naming_a_kernel_thread_recovers():
    """A pi word naming a kernel thread (kthreadd, pid 2, is one where the PID namespace
    shows it): FUTEX_LOCK_PI refuses to attach to it with EPERM, which glibc takes for a
    fatal error ("The futex facility returned an unexpected error code"). No kernel thread
    holds a user futex: the lock is recovered as from a gone owner. Found by the fuzzer."""
    kt = _kernel_thread_tid()
    if kt is None:
        pytest.skip("no kernel thread is visible in this PID namespace")
    name = uniq("glibc-pi")
    lk = shmlocks.PIMutex.create(name)
    try:
        with open(shm_path(name), "rb") as f:
            data = bytearray(f.read())
        struct.pack_into("<I", data, _layout(data)["locks"] + 128, kt)
        p = _run_on_copy(bytes(data), _PI_CHILD)
        _assert_no_crash(p)
        assert "got True owner_died True" in p.stdout, p.stdout
    finally:
        lk.close()


# --------------------------------------------------------------------------- __kind

_KIND_CHILD = """
import sys, shmlocks
r = shmlocks.Region.open(sys.argv[1])
out = {}
for n in r.lock_names():
    lk = r.open_lock(n)
    try:
        got = lk.acquire(timeout=0.2)
        if got:
            if lk.owner_died:
                lk.mark_consistent()
            lk.release()
        out[n] = str(got)
    except Exception as e:
        out[n] = type(e).__name__
try:
    r.create_lock("extra", "robust")
    out["create_lock"] = "ok"
except Exception as e:
    out["create_lock"] = type(e).__name__
print(out)
r.close()
"""

# 0x40: PTHREAD_PRIO_PROTECT (the `new_prio == -1 || ...` assert); 0x20: PI without robust;
# 0x100/0x200: elision; 3: adaptive, 0x90/0xb0: our own robust / pi kinds swapped
KIND_VALUES = [0, 1, 2, 3, 0x10, 0x20, 0x40, 0x80, 0x100, 0x40 | 0x80, 0x90, 0xB0, 0xFFFFFFFF]


def _kind_region():
    name = uniq("glibc-kind")
    reg = shmlocks.Region.create(name, max_locks=8, max_participants=4)
    for k in shmlocks.KINDS:
        reg.create_lock(k, k)
    with open(shm_path(name), "rb") as f:
        data = f.read()
    return reg, data


def _targets(data: bytes) -> dict[str, int]:
    lay = _layout(data)
    names = list(shmlocks.KINDS)

    def body(kind: str) -> int:
        return lay["locks"] + names.index(kind) * lay["stride"]

    return {
        "token0": lay["part"],
        "dir_mutex": 128,
        "repair_mcs": body("mcs") + 64,
        "word_robust": body("robust") + 128,
        "word_pi": body("pi") + 128,
    }


@pytest.mark.parametrize("target", ["token0", "dir_mutex", "repair_mcs", "word_robust", "word_pi"])
def test_scribbled_mutex_kind_never_aborts(target):
    """A foreign __kind in any glibc mutex of the segment: the call is refused before
    glibc sees it (CorruptRegionError), or the mutex is not needed; never SIGABRT.
    (Before: exit -6 for 0x40 in every target.)"""
    reg, data = _kind_region()
    try:
        off = _targets(data)[target] + KIND_OFF
        own = struct.unpack_from("<I", data, off)[0]
        for val in KIND_VALUES:
            if val == own:
                continue
            buf = bytearray(data)
            struct.pack_into("<I", buf, off, val)
            p = _run_on_copy(bytes(buf), _KIND_CHILD)
            _assert_no_crash(p)
            out = eval(p.stdout.strip().splitlines()[-1])  # a dict literal we printed
            if target == "word_robust":
                assert out["robust"] == "CorruptRegionError", (hex(val), out)
            elif target == "word_pi":
                assert out["pi"] == "CorruptRegionError", (hex(val), out)
            elif target == "dir_mutex":
                assert out["create_lock"] == "CorruptRegionError", (hex(val), out)
            elif target == "token0":
                # the slot is skipped: the thread registers in slot 1, every lock works
                assert all(v == "True" for k, v in out.items() if k != "create_lock"), out
    finally:
        reg.close()


def test_all_tokens_corrupt_is_corrupt_region_error():
    """Registration refuses a region whose every free slot has a foreign token."""
    reg, data = _kind_region()
    try:
        lay = _layout(data)
        buf = bytearray(data)
        for i in range(lay["P"]):
            struct.pack_into("<I", buf, lay["part"] + i * TOKEN_STRIDE + KIND_OFF, 0x40)
        p = _run_on_copy(bytes(buf), _KIND_CHILD)
        _assert_no_crash(p)
        out = eval(p.stdout.strip().splitlines()[-1])
        assert out["ticket"] == "CorruptRegionError", out
    finally:
        reg.close()


def test_held_mutex_whose_kind_changes_still_releases():
    """A robust lock we hold whose __kind is scribbled meanwhile: its owner restores the
    kind and releases (glibc must unlink it from the thread's robust list), and the lock
    works afterwards."""
    code = """
import mmap, os, struct, sys, shmlocks
lk = shmlocks.RobustMutex.create(sys.argv[1])
assert lk.acquire()
with open("/dev/shm/" + sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
    hdr = struct.unpack_from("<QIIQIIQQQQ", m, 0)
    off = hdr[8] + 128 + 16
    orig = struct.unpack_from("<I", m, off)[0]
    struct.pack_into("<I", m, off, 0x40)
    lk.release()
    print("restored", struct.unpack_from("<I", m, off)[0] == orig)
    m.close()
print("again", lk.acquire(timeout=1))
lk.release()
lk.close()
"""
    name = uniq("glibc-held")
    try:
        p = run_python(code, name)
        _assert_no_crash(p)
        assert "restored True" in p.stdout and "again True" in p.stdout, p.stdout
    finally:
        shm_remove(name)
