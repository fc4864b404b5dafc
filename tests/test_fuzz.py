"""The segment-bytes fuzzer (tests/support/fuzz.py) in CI: a bounded run over every kind
and field group, and the inputs that once crashed the interpreter, replayed.

No bytes in a segment may crash the interpreter (a child killed by a signal) or hang it (a
child past its deadline: every operation it runs has a timeout). SHMLOCKS_FUZZ_SECONDS and
SHMLOCKS_FUZZ_SEED change the run's budget and seed; a failing input is saved under the
test's tmp_path, replay it with ``python tests/support/fuzz.py --replay FILE``.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZ = os.path.join(HERE, "support", "fuzz.py")
SAVED = sorted(glob.glob(os.path.join(HERE, "data", "fz", "*.bin")))


def _run(*args: str, budget: float) -> dict:
    p = subprocess.run(
        [sys.executable, FUZZ, *args],
        capture_output=True,
        text=True,
        timeout=budget + 240,
    )
    assert p.stdout.strip(), p.stderr[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    summary["log"] = p.stdout[-3000:]
    return summary


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fuzz_segment_bytes_no_crash_no_hang(tmp_path):
    seconds = float(os.environ.get("SHMLOCKS_FUZZ_SECONDS", "25"))
    seed = os.environ.get("SHMLOCKS_FUZZ_SEED", "1")
    s = _run("--seconds", str(seconds), "--seed", seed, "--save", str(tmp_path), budget=seconds)
    assert s["crashes"] == 0 and s["hangs"] == 0 and s["other"] == 0, s
    assert s["trials"] >= 12, s  # every kind targeted at least twice
    # A fuzzer whose images never get past open() tests nothing: most must open.
    refused = sum(v for k, v in s["errors"].items() if k.startswith("open:"))
    assert refused < s["trials"] / 2, s


@pytest.mark.timeout(600)
def test_saved_crash_inputs_replay_clean():
    """The saved inputs (tests/data/fz/): a4_scribble.py's each once killed the interpreter
    (SIGABRT, `___pthread_mutex_trylock: Assertion 'robust'` and the __kind asserts);
    robust-spin-*.bin (the fuzzer, seed 20261205) each made a robust waiter spin past every
    deadline on a word with no owner that trylock would not take (FUTEX_WAITERS alone);
    barrier-enrol-guard-138.bin (the fuzzer, seed 11) hung opening a Barrier whose guard
    word names a live thread (the open enrols the process, under the guard);
    dead-token-spin-72.bin (seed 34) made a Barrier.wait(0.05) spin for good on a member
    whose token says dead and that no recovery could change (tb_watch said "changed" each
    time), and barrier-count-349.bin (seed 34) made one wait without end for an action
    no thread ran (a count of 21801 of 2 parties)."""
    assert SAVED
    s = _run("--replay", *SAVED, budget=60)
    assert s["trials"] == len(SAVED)
    # each input must reach the calls that once aborted, not stop at open()
    assert not [k for k in s["errors"] if k.startswith("open:")], s
    assert s["crashes"] == 0 and s["hangs"] == 0 and s["other"] == 0, s
