"""Read-mostly throughput (README "Reader-writer lock"; docs/design.md §13): P processes
loop for a fixed time, each op a read (19 in 20: take the read side, load a shared word,
let go) or a write (1 in 20: take the write side, increment the word non-atomically, let
go). Ops/s summed over the processes (median of the repeats, min-max), and the writes
done (so a lock that starves its writers shows), for:

  shmlocks.RWLock            phase-fair, readers write only their own line
  shmlocks futex mutex       the fastest plain mutex kind under contention (bench/README),
                             taken for reads and writes alike
  pthread_rwlock_t           glibc's, process-shared in an anonymous shared mapping,
                             writer-preferring (the default prefers readers and starves
                             the writers here); no recovery: a reference, not a rival
  fasteners rwlock           fasteners.InterProcessReaderWriterLock (fcntl on a file), if
                             fasteners is installed (`pip install fasteners`)

Every run checks the word against the writes the processes counted: a lock that let two
writers in shows a lost increment (the run fails).

    python bench/rwlock.py [--seconds S] [--repeats N] [--procs 1,2,4] [--work N]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import mmap
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

import shmlocks

CTX = mp.get_context("fork")
WRITE_EVERY = 20  # 1 op in 20 writes: 95% reads
_PTHREAD_RWLOCK_SIZE = 56  # glibc x86_64/aarch64 pthread_rwlock_t
_PREFER_WRITER_NONRECURSIVE = 2  # PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP


class _PthreadRW:
    """A process-shared pthread_rwlock_t in an anonymous shared mapping (made before the
    fork, so every child sees it at the same address)."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.mm = mmap.mmap(-1, 4096)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        attr = ctypes.create_string_buffer(64)
        assert self.libc.pthread_rwlockattr_init(attr) == 0
        assert self.libc.pthread_rwlockattr_setpshared(attr, 1) == 0
        assert self.libc.pthread_rwlockattr_setkind_np(attr, _PREFER_WRITER_NONRECURSIVE) == 0
        assert self.libc.pthread_rwlock_init(ctypes.c_void_p(self.addr), attr) == 0
        p = ctypes.c_void_p(self.addr)
        rd, wr, un = (
            self.libc.pthread_rwlock_rdlock,
            self.libc.pthread_rwlock_wrlock,
            self.libc.pthread_rwlock_unlock,
        )
        self.read = (lambda: rd(p), lambda: un(p))
        self.write = (lambda: wr(p), lambda: un(p))


def _make(name: str):
    """(per-process setup: () -> (acquire_read, release_read, acquire_write,
    release_write)), cleanup."""
    if name == "RWLock":
        rw = shmlocks.RWLock(max_participants=16)

        def setup():
            return rw.acquire_read, rw.release_read, rw.acquire_write, rw.release_write

        return setup, rw.close
    if name == "futex mutex":
        lk = shmlocks.FutexMutex(max_participants=16)

        def setup():
            return lk.acquire, lk.release, lk.acquire, lk.release

        return setup, lk.close
    if name == "pthread_rwlock_t":
        p = _PthreadRW()

        def setup():
            return (*p.read, *p.write)

        return setup, p.mm.close
    if name == "fasteners rwlock":
        import fasteners

        fd, path = tempfile.mkstemp(prefix="shmlocks-bench-rw-")
        os.close(fd)

        def setup():
            lk = fasteners.InterProcessReaderWriterLock(path)  # one per process (fcntl)
            return (
                lk.acquire_read_lock,
                lk.release_read_lock,
                lk.acquire_write_lock,
                lk.release_write_lock,
            )

        return setup, lambda: os.unlink(path)
    raise ValueError(name)


def _worker(setup, word, counts, i, start, stop, work):
    ar, rr, aw, rw = setup()
    inside = range(work)
    while not start.value:
        pass
    n = w = 0
    while not stop.value:
        for _ in range(WRITE_EVERY - 1):
            ar()
            word[0]  # noqa: B018 - the read
            for _ in inside:  # the section's work
                pass
            rr()
        aw()
        word[0] = word[0] + 1  # non-atomic: exact only if writers exclude
        for _ in inside:
            pass
        rw()
        n += WRITE_EVERY
        w += 1
    counts[2 * i] = n
    counts[2 * i + 1] = w


def run_once(name: str, procs: int, seconds: float, work: int = 0) -> tuple[float, float]:
    """(ops/s, writes/s) of one run; AssertionError if a write was lost."""
    setup, cleanup = _make(name)
    word = CTX.RawArray("q", 1)
    counts = CTX.RawArray("q", 2 * procs)
    start, stop = CTX.RawValue("i", 0), CTX.RawValue("i", 0)
    ps = [
        CTX.Process(target=_worker, args=(setup, word, counts, i, start, stop, work), daemon=True)
        for i in range(procs)
    ]
    try:
        for p in ps:
            p.start()
        time.sleep(0.2)
        start.value = 1
        t0 = time.monotonic()
        time.sleep(seconds)
        stop.value = 1
        for p in ps:
            p.join(60)
        dt = time.monotonic() - t0
        for p in ps:
            if p.exitcode != 0:
                raise AssertionError(f"{name}: a worker exited with {p.exitcode}")
        ops = sum(counts[0::2])
        writes = sum(counts[1::2])
        assert word[0] == writes, f"{name}: {word[0]} increments for {writes} writes"
        return ops / dt, writes / dt
    finally:
        for p in ps:
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, 9)
                p.join(5)
        cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument(
        "--work",
        type=int,
        default=0,
        help="iterations of an empty Python loop inside every section (0: the load alone; "
        "50: about 1 us)",
    )
    args = ap.parse_args(argv)
    plist = [int(x) for x in args.procs.split(",")]
    names = ["RWLock", "futex mutex", "pthread_rwlock_t"]
    try:
        import fasteners  # noqa: F401

        names.append("fasteners rwlock")
    except ImportError:
        print("(fasteners not installed: its row is left out)", file=sys.stderr)
    res: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(args.repeats):  # repeats interleaved across the locks
        for name in names:
            for p in plist:
                res.setdefault((name, p), []).append(run_once(name, p, args.seconds, args.work))
    ncpu = len(os.sched_getaffinity(0))
    print(
        f"read-mostly (95% reads) throughput, {ncpu} CPUs, {args.seconds:g} s x "
        f"{args.repeats} runs, --work {args.work}: ops/s median (min-max); writes/s "
        "median\n"
    )
    print("| lock | " + " | ".join(f"P = {p}" for p in plist) + " |")
    print("|---|" + "---|" * len(plist))
    for name in names:
        cells = []
        for p in plist:
            ops = [r[0] for r in res[(name, p)]]
            wr = statistics.median(r[1] for r in res[(name, p)])
            cells.append(
                f"{statistics.median(ops):,.0f} ({min(ops):,.0f}-{max(ops):,.0f}); w {wr:,.0f}/s"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
