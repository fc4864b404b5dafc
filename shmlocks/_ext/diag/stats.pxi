# stats.pxi -- per-lock statistics: the reads and the reset (stats.pxd: the counting).



cdef dict stats_read(shm_lockctl* c):
    """A snapshot of the counters (each read atomically; the set is not one instant)."""
    return {"acquisitions": ld64_rlx(&c.acquisitions),
            "contended": ld64_rlx(&c.contended),
            "wait_total_s": ld64_rlx(&c.wait_total_ns) / 1e9,
            "wait_max_s": ld64_rlx(&c.wait_max_ns) / 1e9,
            "timeouts": ld32_rlx(&c.timeouts),
            "owner_deaths": ld32_rlx(&c.owner_deaths),
            "handoffs": ld64_rlx(&c.handoffs)}


cdef void stats_reset(shm_lockctl* c) noexcept nogil:
    """Zero every counter (last_pid stays: it is state, not a count). Not atomic with a
    holder's plain increments: one counter a holder is updating at that instant may keep
    its value from before the reset."""
    st64_seq(&c.acquisitions, 0)
    st64_seq(&c.handoffs, 0)
    st64_seq(&c.contended, 0)
    st64_seq(&c.wait_total_ns, 0)
    st64_seq(&c.wait_max_ns, 0)
    st32_seq(&c.owner_deaths, 0)
    st32_seq(&c.timeouts, 0)
