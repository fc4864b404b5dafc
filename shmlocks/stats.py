"""The statistics of every lock of one segment (a region or a standalone lock), from the
counters in the segment (docs/design.md §10), for ``shmlocks stat`` (shmlocks/cli/stat.py)
and ``shmlocks top``.

Read-only: the segment is read as ``inspect`` reads it (a validated private copy read with
pread: shmlocks/_segment.py) and its counters are shown as the numbers they hold,
scribbled or not. What ``top`` shows live comes from
:func:`segment_stats` too.
"""

from __future__ import annotations

from typing import Any

from shmlocks import _segment

STAT_KEYS = (
    "acquisitions",
    "contended",
    "wait_total_s",
    "wait_max_s",
    "timeouts",
    "owner_deaths",
    "handoffs",
)


#: an RWLock record's ``reads``: the read side's counters under the keys a lock's have
READ_KEYS = ("acquisitions", "contended", "wait_total_s", "wait_max_s", "timeouts")


def segment_stats(name: str, seg: _segment.Segment | None = None) -> dict[str, Any]:
    """Every lock of segment ``name``: its kind, holder (pid, tid, alive), waiters and
    counters, as plain data (what ``stat --json`` prints). ``seg``: its copy, if read
    already (else it is read here).

    An RWLock's record is its write side (the writer as ``holder``, the writers waiting as
    ``waiters``, the ctl line's counters), plus ``reads``: the read side (:func:`rw_reads`)."""
    if seg is None:
        seg = _segment.read(name)  # a private copy
    return {"name": name, "locks": locks_stats(seg)}


def locks_stats(seg: _segment.Segment) -> list[dict[str, Any]]:
    """``segment_stats``'s ``locks``, of a segment read already."""
    d = _segment.describe(seg)
    locks = []
    for lk, body in zip(d["locks"], seg.locks, strict=True):
        c = _segment.lock_stats(body)
        rec = {
            "name": lk["name"],
            "kind": lk["kind"],
            "locked": lk["locked"],
            "holder": lk["holder"] if lk["locked"] else None,
            "waiters": lk["waiters"],
            **{k: c[k] for k in STAT_KEYS},
        }
        if lk["kind"] == "table" and seg.table is not None:
            # a lock table (docs/design.md §15): one entry, its stripes' counters summed,
            # the stripes held or waited for and the hottest, each with holder and waiters
            c = _segment.table_stats(seg.table)
            rec.update({k: c[k] for k in STAT_KEYS})
            rec["holder"] = None
            for k in ("size", "stripe_kind", "held", "stripes", "hottest", "hottest_stripes"):
                rec[k] = lk[k]
        if lk["kind"] == "rwlock":
            reads = rw_reads(seg, body, lk["readers"])
            rec["waiters"] = reads.pop("writers_waiting")
            rec["reads"] = reads
        locks.append(rec)
    return locks


def rw_reads(
    seg: _segment.Segment, body: _segment.Lock, readers: list[dict[str, Any]]
) -> dict[str, Any]:
    """An RWLock's read side from its participant lines (shm_rwlock.h shm_rwrec): the
    reads' counters summed over the participants (``wait_max_s``: the largest), the
    participants holding reads (``holders``, and ``readers`` as ``_segment._rw_describe``
    lists them), the live ones that sleep waiting to read (``waiters``: their indicator
    is tagged blocked) and, popped by the caller, those that wait to write
    (``writers_waiting``)."""
    recs = body.rw_recs
    waiting = [
        r.ind & _segment._RW_BLOCKED != 0
        for x, r in enumerate(recs)
        if r.waiting and seg.participant(x).state == 1
    ]
    return {
        "acquisitions": sum(r.reads for r in recs),
        "contended": sum(r.read_waits for r in recs),
        "wait_total_s": sum(r.read_wait_ns for r in recs) / 1e9,
        "wait_max_s": max((r.read_wait_max_ns for r in recs), default=0) / 1e9,
        "timeouts": sum(r.timeouts for r in recs),
        "holders": len(readers),
        "readers": [
            {k: rd[k] for k in ("slot", "pid", "tid", "alive", "other_namespace", "holds")}
            for rd in readers
        ],
        "waiters": sum(waiting),
        "writers_waiting": len(waiting) - sum(waiting),
    }


def duration(seconds: float | None) -> str:
    """A wait for people: ``-``, ``850 ns``, ``12.5 us``, ``3.20 ms``, ``1.50 s``."""
    if seconds is None:
        return "-"
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _who(h: dict[str, Any]) -> str:
    if h.get("other_namespace"):
        return "other namespace"
    return f"pid {h['pid']} {'alive' if h['alive'] else 'DEAD'}"


def holder_text(lk: dict[str, Any]) -> str:
    """The HOLDER column of a lock's row, or of an RWLock's write row (its writer only:
    readers are on the read row, :func:`readers_text`)."""
    h = lk.get("holder")
    if "stripes" in lk:  # a lock table: its stripes held
        return stripes_text(lk["stripes"])
    if "reads" in lk:  # an RWLock: a writer, or nobody writing
        return _who(h) if h else "-"
    if not lk.get("locked"):
        return "-"
    if not h:
        return "held"
    return _who(h)


def stripes_text(stripes: list[dict[str, Any]]) -> str:
    """The HOLDER column of a lock table's row: ``-``, the one stripe held as
    ``[i] pid ..``, or ``3 stripes held (2 pids)``, the dead holders called out."""
    held = [s for s in stripes if s["locked"]]
    if not held:
        return "-"
    if len(held) == 1:
        h = held[0].get("holder")
        return f"[{held[0]['index']}] " + (_who(h) if h else "held")
    hs = [s["holder"] for s in held if s.get("holder")]
    pids = len({h["pid"] for h in hs})
    dead = sum(1 for h in hs if not h["alive"])
    text = f"{len(held)} stripes held ({pids} pid{'s' if pids != 1 else ''})"
    return text + (f", {dead} DEAD" if dead else "")


def table_kind(lk: dict[str, Any]) -> str:
    """The KIND cell of a lock table: ``table (4096 futex)``."""
    return f"table ({lk['size']} {lk['stripe_kind']})"


def hottest_text(lk: dict[str, Any], n: int = 3) -> str:
    """A table's hottest stripes in a line: ``[12] 3,402 (pid 7 alive), [5] 998``."""
    out = []
    for s in lk.get("hottest_stripes", [])[:n]:
        h = s.get("holder") if s.get("locked") else None
        extra = [_who(h)] if h else []
        if s.get("waiters"):
            extra.append(f"{s['waiters']} waiting")
        out.append(
            f"[{s['index']}] {s['acquisitions']:,}" + (f" ({', '.join(extra)})" if extra else "")
        )
    return ", ".join(out) or "-"


def readers_text(reads: dict[str, Any]) -> str:
    """The HOLDER column of an RWLock's read row: ``-``, the one reader as a lock's
    holder, or ``3 readers (2 pids)``, with the dead ones called out (``, 1 DEAD``)."""
    rs = reads["readers"]
    if not rs:
        return "-"
    if len(rs) == 1:
        return _who(rs[0])
    pids = len({r["pid"] for r in rs})
    dead = sum(1 for r in rs if not r["alive"])
    text = f"{len(rs)} readers ({pids} pid{'s' if pids != 1 else ''})"
    return text + (f", {dead} DEAD" if dead else "")
