"""inspect.signature works on the compiled API: every public method and classmethod of
Region and the lock kinds, and the module's functions, as help(), IDEs and tools such as
stubtest read them. The build embeds them in Argument Clinic form (setup.py:
embedsignature.format = "clinic"), which CPython turns into __text_signature__; only the
docstrings change, not the methods."""

from __future__ import annotations

import inspect

import pytest

import shmlocks


def _public_callables():
    for cls in [shmlocks.Region, *shmlocks.KINDS.values()]:
        for name in dir(cls):
            if name.startswith("_") and name not in ("__enter__", "__exit__"):
                continue
            f = getattr(cls, name)
            if callable(f) and not isinstance(f, type):
                yield f"{cls.__name__}.{name}", f
    for name in ("set_deadlock_timeout", "get_deadlock_timeout", "crashpoint"):
        yield name, getattr(shmlocks, name)


CALLABLES = dict(_public_callables())


@pytest.mark.parametrize("name", sorted(CALLABLES))
def test_every_public_callable_has_a_signature(name):
    inspect.signature(CALLABLES[name])


def test_the_signatures_are_the_documented_ones():
    sig = inspect.signature(shmlocks.MCSLock.create)
    assert list(sig.parameters) == ["name", "max_participants", "mode", "persist"]
    assert sig.parameters["max_participants"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["max_participants"].default is None
    assert sig.parameters["mode"].default == 0o600
    acq = inspect.signature(shmlocks.TicketLock.acquire)
    assert [(p.name, p.default) for p in list(acq.parameters.values())[1:]] == [
        ("blocking", True),
        ("timeout", -1),
    ]
    assert list(inspect.signature(shmlocks.Region.open_lock).parameters) == ["self", "name"]
    assert list(inspect.signature(shmlocks.Region.create).parameters) == [
        "name",
        "max_locks",
        "max_participants",
        "mode",
        "persist",
    ]
