"""``shmlocks deadlocks [--json]``: every cycle of the machine-wide wait-for graph
(shmlocks/waitgraph.py), and what ``shmlocks inspect`` adds per participant: the locks it
holds and the lock it waits for (in this segment or another) and for how long.

Exit status 3 when there is a cycle, 0 when there is none. Segments that cannot be read
(foreign, scribbled, another layout version, no permission) are skipped, each with one
line on stderr (in ``--json``, the list ``skipped``).
"""

from __future__ import annotations

from typing import Any

from shmlocks import _segment, waitgraph

EXIT_NONE = 0
EXIT_CYCLE = 3


def cycles_report(g: waitgraph.Graph) -> dict[str, Any]:
    """The graph's cycles as plain data (what ``--json`` prints)."""
    now = g.taken_ns
    cycles = []
    for c in g.cycles():
        v = g.victim(c[0].thread.key)
        cycles.append(
            [
                {
                    "pid": m.thread.pid,
                    "tid": m.thread.tid,
                    "task": m.thread.task,
                    "holds": m.held.label,
                    "holds_kind": m.held.kind,
                    "holds_as": m.thread.modes.get(m.held),
                    "waits_for": m.awaited.label,
                    "waits_for_kind": m.awaited.kind,
                    "waits_as": m.thread.waits_as,
                    "waited_s": round(m.thread.waited_s(now), 3),
                    "detects": m.thread.detects,
                    "victim": m.thread.key == v,
                }
                for m in c
            ]
        )
    waiting = sum(1 for t in g.threads.values() if t.waits is not None)
    return {"cycles": cycles, "waiting_threads": waiting, "skipped": list(g.notes)}


def units(n: int) -> str:
    """A semaphore's units held, as HOLDS shows them."""
    return f"{n} unit" if n == 1 else f"{n} units"


def annotate(d: dict[str, Any], seg: _segment.Segment | None = None) -> dict[str, Any]:
    """Add to ``Region._describe()``'s participants what each holds and waits for, over
    every segment (``holds``, ``waits_for``, ``waiting_s``; None: not waiting). ``seg``:
    the copy ``d`` describes, if read already (the look uses it, not a read of its own)."""
    name = d["name"]
    g = waitgraph.snapshot(threads_of=seg if seg is not None else name)
    here: dict[int, list[str]] = {}
    for lk in d.get("locks", []):
        h = lk.get("holder")
        if lk.get("locked") and h:
            here.setdefault(h["slot"], []).append(lk["name"])
        for r in lk.get("readers", ()):  # an RWLock's readers hold it too (shared)
            here.setdefault(r["slot"], []).append(f"{lk['name']} (read)")
        for st in lk.get("stripes", ()):  # a lock table's stripes held
            sh = st.get("holder")
            if st["locked"] and sh and sh.get("slot") is not None:
                here.setdefault(sh["slot"], []).append(st["name"])
        for u in lk.get("holders", ()):  # a semaphore's units taken with `with`
            here.setdefault(u["slot"], []).append(f"{lk['name']} ({units(u['units'])})")

    for slot, hs in here.items():  # a hold of many stripes of a table: the first few
        if len(hs) > 8:
            here[slot] = hs[:6] + [f"... {len(hs) - 6} more"]

    def short(ref: waitgraph.LockRef) -> str:
        return ref.name if ref.segment == name else ref.label

    parts = []
    for p in d.get("participants", []):
        holds = list(here.get(p["slot"], []))
        waits, waiting = None, None
        key_alive = g.slots.get((name, p["slot"]))
        t = g.threads.get(key_alive[0]) if key_alive and key_alive[1] else None
        if t is not None:
            holds += [
                f"{r.label} ({t.modes[r]})" if r in t.modes else r.label
                for r in t.holds
                if r.segment != name
            ]
            if t.waits is not None:
                waits, waiting = short(t.waits), round(t.waited_s(g.taken_ns), 3)
        parts.append(dict(p, holds=holds, waits_for=waits, waiting_s=waiting))
    return dict(d, participants=parts)
