# mcsc.pxd -- the compact MCS stripe of a lock table: the interface of mcsc.pxi (its word
# table and invariant: the top of mcsc.pxi; docs/design.md §15).

# the view of word A (the stripe line's repair slot, byte 64: shm_layout.h shm_stripe_at),
# named as queue.pxd names the tail; the word table is at the top of mcsc.pxi
#   wa.u64[0] tail    0 | (H(h), 0) | (last waiter's node, its pred): queue.pxd's codec
#   wa.u32[2] first   the first waiter's node: a hint
cdef enum:
    MC_HELD = 0x80000000          # a holder mark: MC_HELD | (participant + 1)


cdef inline uint32_t mc_mark(uint32_t q) noexcept nogil:
    return MC_HELD | (q + 1)


cdef inline bint mc_is_mark(uint32_t v) noexcept nogil:
    return (v & MC_HELD) != 0 and v != SHM_ID_UNKNOWN


cdef inline uint64_t* mc_tail(shm_body* b) noexcept nogil:
    return &b.wa.u64[0]


cdef inline uint32_t* mc_first(shm_body* b) noexcept nogil:
    return &b.wa.u32[2]


cdef class MCSStripe(MCSLock):
    # overrides _fast, _try, _wait, _unlock (base/kind.pxd); adds:
    cdef int _mc_join(self, uint32_t me, bint armed) noexcept nogil

# the recovery of a dead participant on a compact stripe (the ops entry's stripe_recover:
# base/kind.pxd _register_stripe)
cdef void _mc_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil
