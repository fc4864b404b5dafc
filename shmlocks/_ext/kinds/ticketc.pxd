# ticketc.pxd -- the compact ticket stripe of a LockTable (docs/design.md §15): the
# interface of ticketc.pxi (its word table and protocol: the top of ticketc.pxi). A lock
# body's ticket lock is ticket.pxi, unchanged; this is the same kind (kind_code, FIFO,
# abandonable tickets) on one 128-byte line, with no line per participant per stripe.

# The stripe's words (the repair slot of its ctl line, shm_layout.h SHM_STRIPE_*): word A
# is next (as a lock body's, ticket.pxd ticket_next), word B serving (the view aims wb at
# SHM_STRIPE_TICKET_WB_OFF, so ticket.pxd's ticket_serving reads it too), then two u32.
cdef inline uint32_t* tc_parked(shm_body* b) noexcept nogil:
    return &b.wa.u32[4]


cdef inline uint32_t* tc_marks(shm_body* b) noexcept nogil:
    return &b.wa.u32[5]


cdef inline uint32_t* tc_serving_word(shm_body* b) noexcept nogil:
    """serving's low half: the futex word every waiter of the stripe parks on."""
    return <uint32_t*>ticket_serving(b)


cdef enum:
    TC_TBITS = 40                 # a tagged ticket: (lock number + 1) << 40 | ticket mod 2**40


cdef struct _tc_ctx:
    shm_body* b
    uint64_t t                    # our ticket (full width)
    shm_prec* r                   # our table line (the ticketless wait: its marker)


cdef class TicketStripe(TicketLock):
    # overrides _fast, _try, _wait, _unlock, _is_locked (base/kind.pxd); adds:
    cdef int _tc_abandon(self, uint32_t me, uint64_t t) noexcept nogil
    cdef int _tc_ticketless(self, uint32_t me, wait_t* w) noexcept nogil
    cdef int _tc_queued(self, uint32_t me, wait_t* w) noexcept nogil

