"""The test suite's fixtures. The helpers tests import live in tests/support/."""

from __future__ import annotations

import gc
import os

import pytest
from support import common
from support.common import (
    KINDS,
    NAME_PREFIX,
    SHM_DIR,
    Procs,
    close_quietly,
    shm_entries,
    shm_remove,
    uniq,
)

import shmlocks


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (README's test command): two workers a CPU, at most 8.

    Most of this suite waits rather than computes: for a child interpreter to reach a crash
    point, for a SIGKILLed holder's death to be seen, for a timeout to pass: with one worker
    a CPU, the CPUs sit idle for much of the run. Tests that measure time compare against
    figures taken in the same run, so they hold on a machine kept busy this way.
    ``SHMLOCKS_TEST_WORKERS=N`` chooses N instead.
    """
    chosen = os.environ.get("SHMLOCKS_TEST_WORKERS")
    if chosen:
        return int(chosen)
    return max(2, min(2 * (os.cpu_count() or 1), 8))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test that takes several seconds on purpose")


@pytest.fixture(autouse=True)
def _no_shm_leak():
    """Fail a test that leaves one of *its own* segments in /dev/shm.

    xdist runs tests of other workers at the same time, so only names this test made are
    considered: those uniq() handed out during it, or shmlt- names carrying this worker's
    PID that appeared during it (each worker runs one test at a time).
    """
    common.names_this_test.clear()
    before = shm_entries()
    yield
    gc.collect()  # creator objects dropped by the test are finalised (and unlink) here
    token = f"-{os.getpid()}-"
    after = shm_entries()
    leaked = sorted(
        n
        for n in after
        if n.startswith(NAME_PREFIX)
        and (n in common.names_this_test or (n not in before and token in n))
    )
    for n in leaked:
        shm_remove(n)
    assert not leaked, f"segments left in {SHM_DIR} by this test: {leaked}"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


def _closing_factory(create):
    """A factory fixture's body: every object ``create(*args, **kwargs)`` makes is closed
    (its name unlinked) at teardown, the last made first."""
    made = []

    def make(*args, **kwargs):
        obj = create(*args, **kwargs)
        made.append(obj)
        return obj

    yield make
    for obj in reversed(made):
        close_quietly(obj)


@pytest.fixture
def new_lock(shmlock):
    """Factory: ``new_lock(kind, **create_kwargs)`` makes a lock with a unique name (this
    test's), through the plugin's ``shmlock`` fixture (shmlocks/pytest_plugin.py), which
    closes it and unlinks its name at teardown."""

    def create(kind_name: str, **kwargs):
        kwargs.setdefault("name", uniq(kind_name))
        return shmlock(kind_name, **kwargs)

    return create


@pytest.fixture
def new_region():
    """Factory: ``new_region(**create_kwargs)``, closed at teardown."""

    def create(**kwargs):
        kwargs.setdefault("name", uniq("region"))
        return shmlocks.Region.create(**kwargs)

    yield from _closing_factory(create)


@pytest.fixture
def procs():
    tracker = Procs()
    try:
        yield tracker
    finally:
        tracker.cleanup()
