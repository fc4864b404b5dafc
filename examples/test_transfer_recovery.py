"""A two-account transfer protected by a shmlocks lock, and a test that proves its repair.

The invariant: the two balances always add up to TOTAL. A transfer debits one account,
then credits the other, under the lock. A worker killed between the two (the OOM killer,
a crash) leaves the money half moved. The next holder sees ``owner_died``, puts the
invariant right from what it finds, and calls ``mark_consistent()``.

Run it with ``python -m pytest examples/test_transfer_recovery.py``.
"""

from __future__ import annotations

import multiprocessing

import shmlocks
from shmlocks.testing import kill_while_holding

TOTAL = 1_000


def transfer(lock, accounts, amount):
    """Move `amount` from account 0 to account 1."""
    with lock:
        if lock.owner_died:
            repair(accounts)
            lock.mark_consistent()
        accounts[0] -= amount
        shmlocks.crashpoint("transfer.debited")  # a death here leaves the money half moved
        accounts[1] += amount


def repair(accounts):
    """After a death mid-transfer: the debit happened, the credit did not; finish it."""
    accounts[1] = TOTAL - accounts[0]


def test_a_transfer_killed_between_debit_and_credit_is_repaired():
    lock = shmlocks.MCSLock()
    try:
        accounts = multiprocessing.get_context("fork").RawArray("q", [TOTAL, 0])
        kill_while_holding(lock, transfer, lock, accounts, 100, at="transfer.debited")
        assert sum(accounts) == TOTAL - 100, "the worker died between debit and credit"
        with lock:
            assert lock.owner_died
            repair(accounts)
            lock.mark_consistent()
        assert sum(accounts) == TOTAL
        transfer(lock, accounts, 50)  # and the lock is as good as new
        assert list(accounts) == [TOTAL - 150, 150]
    finally:
        lock.close()
