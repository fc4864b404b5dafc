"""The exclusion checker: one way, for the tests, the torture, the demo and the bench, to tell
whether a lock excluded.

Participants (processes or threads, numbered ``who`` >= 1) share a few int64 words (an
``mmap`` cast to ``"q"``, a ``multiprocessing`` RawArray: anything indexable) and, holding the
lock, run a critical section that

* increments a shared counter with a plain, non-atomic read-modify-write (a load, optionally
  a yield to widen the window, a store): without real exclusion increments are lost, and
  ``counter == sum(done)`` fails at the end;
* sets a marker ``(who, counter, done[who])`` for its whole length: a section that finds the
  marker already set overlapped another one (or an owner death went unreported), a
  violation counted as it happens.

A participant SIGKILLed inside its section leaves the marker set. The next holder sees
``owner_died`` and calls :meth:`Exclusion.repair`, which settles the section from the words
themselves: if the counter was incremented but the dead participant's count was not, the
section is credited to it (``inflight``); otherwise nothing or all of it happened. Repair is
idempotent (a repairer killed while repairing is repaired again), so after any number of
deaths ``counter == sum(done)`` holds exactly when the lock excluded.

Also counted: hand-offs (README.md, "Hand-off"), holds by another participant than the
previous holder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# the words, relative to the checker's base
COUNTER = 0  # incremented non-atomically under the lock
MARK_W = 1  # who is inside its section (the marker), or 0
MARK_C = 2  # ... the counter when that section began
MARK_D = 3  # ... and done[who] when it began
VIOLATIONS = 4  # sections that found another one in progress
INFLIGHT = 5  # sections of dead participants credited by repair()
LAST = 6  # who held last
HANDOFFS = 7  # hand-offs: holds by another participant than the last holder
DONE = 8  # + who: sections completed by participant ``who``


def words(participants: int) -> int:
    """How many int64 words a checker for ids ``1 .. participants`` needs."""
    return DONE + participants + 1


@dataclass
class ExclusionReport:
    """The verdict: ``ok`` if no section overlapped and no increment was lost."""

    total: int  # the counter
    expected: int  # sections completed (sum of done), or what the caller expected
    violations: int
    inflight: int = 0
    handoffs: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.total == self.expected and self.violations == 0


class Exclusion:
    """The checker's words in ``a`` from index ``base`` on (see the module docstring)."""

    def __init__(self, a: Any, base: int = 0, participants: int = 64) -> None:
        self.a = a
        self.base = base
        self.participants = participants

    # -- one section at a time (the lock is held between enter() and leave())

    def enter(self, who: int, widen: bool = False) -> int:
        """The first half of a section: check for overlap, set the marker, increment the
        counter non-atomically (``widen``: yield the CPU between the load and the store).
        Returns the counter's value before the increment."""
        a, b = self.a, self.base
        if a[b + MARK_W]:
            a[b + VIOLATIONS] += 1  # someone else is inside, or its death went unreported
            self.repair()
        if a[b + LAST] != who:
            a[b + LAST] = who
            a[b + HANDOFFS] += 1
        c = a[b + COUNTER]
        a[b + MARK_C] = c
        a[b + MARK_D] = a[b + DONE + who]
        a[b + MARK_W] = who
        if widen:
            os.sched_yield()
        a[b + COUNTER] = c + 1
        return int(c)

    def count(self, who: int) -> None:
        """The section's own count, after the increment (a death in between is repaired)."""
        self.a[self.base + DONE + who] += 1

    def leave(self, who: int) -> None:
        """The last step of a section, just before release(): clear the marker."""
        a, b = self.a, self.base
        if a[b + MARK_W] != who:
            a[b + VIOLATIONS] += 1  # another section ran inside ours
        a[b + MARK_W] = 0

    def section(self, who: int, widen: bool = False) -> int:
        """A whole section (enter, count, leave); the lock is held around it."""
        c = self.enter(who, widen)
        self.count(who)
        self.leave(who)
        return c

    def repair(self) -> None:
        """The holder saw ``owner_died``: settle the section the dead holder left pending."""
        a, b = self.a, self.base
        who = a[b + MARK_W]
        if not who:
            return
        if not 0 < who < self.participants + 1:
            a[b + VIOLATIONS] += 1  # a marker no participant could have written
        elif a[b + COUNTER] == a[b + MARK_C] + 1 and a[b + DONE + who] == a[b + MARK_D]:
            a[b + INFLIGHT] += 1
            a[b + DONE + who] += 1  # incremented, not yet counted: credit the dead one
        a[b + MARK_W] = 0

    # -- N acquisitions in a loop

    def loop(
        self,
        acquire: Callable[[], object],
        release: Callable[[], object],
        who: int,
        iterations: int,
        widen_every: int = 0,
    ) -> None:
        """``iterations`` times: acquire, run a section, release. ``widen_every``: yield the
        CPU inside every n-th section. The section is :meth:`section`'s, written out (nobody
        dies here, so the marker is the participant alone: nothing to repair)."""
        a, b = self.a, self.base
        ctr, mark, viol = b + COUNTER, b + MARK_W, b + VIOLATIONS
        last, hand = b + LAST, b + HANDOFFS
        for n in range(iterations):
            acquire()
            try:
                if a[mark]:
                    a[viol] += 1
                a[mark] = who
                if a[last] != who:
                    a[last] = who
                    a[hand] += 1
                c = a[ctr]
                if widen_every and not n % widen_every:
                    os.sched_yield()
                a[ctr] = c + 1
                if a[mark] != who:
                    a[viol] += 1
                a[mark] = 0
            finally:
                release()
        a[b + DONE + who] += iterations

    def count_until(
        self, acquire: Callable[[], object], release: Callable[[], object], who: int, stop: int
    ) -> int:
        """Acquire, increment, release until the word ``a[stop]`` is nonzero (read before
        each acquisition); returns the count. The lightest section the checker has, for
        benchmarks: the non-atomic increment alone (a lost update still shows in the
        count, an overlap that loses none does not)."""
        a = self.a
        ctr = self.base + COUNTER
        n = 0
        while not a[stop]:
            acquire()
            a[ctr] = a[ctr] + 1  # non-atomic on purpose: exact only under exclusion
            release()
            n += 1
        a[self.base + DONE + who] += n
        return n

    # -- the verdict

    def done(self) -> list[int]:
        """Sections completed, per participant id ``0 .. participants``."""
        b = self.base + DONE
        return [int(self.a[b + i]) for i in range(self.participants + 1)]

    def report(self, expected: int | None = None, seconds: float = 0.0) -> ExclusionReport:
        """The verdict; ``expected`` defaults to the sections the participants counted."""
        a, b = self.a, self.base
        return ExclusionReport(
            total=int(a[b + COUNTER]),
            expected=sum(self.done()) if expected is None else expected,
            violations=int(a[b + VIOLATIONS]),
            inflight=int(a[b + INFLIGHT]),
            handoffs=int(a[b + HANDOFFS]),
            seconds=seconds,
        )
