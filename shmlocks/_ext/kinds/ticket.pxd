# ticket.pxd -- FIFO ticket lock with abandonable tickets: the interface of ticket.pxi
# (the kind contract it implements: base/kind.pxd; its word table: the top of ticket.pxi).

# The ticket lock's words, named as qspinlock_types.h names the parts of its word (what
# each means: the word table at the top of ticket.pxi):
#   word A  u64 next      the next ticket to take: fetch_add takes one
#   word B  u64 serving   the ticket being served; moves by CAS only, s - 1 -> s
cdef inline uint64_t* ticket_next(shm_body* b) noexcept nogil:
    return &b.wa.u64[0]


cdef inline uint64_t* ticket_serving(shm_body* b) noexcept nogil:
    return &b.wb.u64[0]


cdef struct _ticket_ctx:
    uint64_t* serving     # what the wait watches: serving (a ticket's wait), or an
    uint64_t t            # inherited ticket's marker (the settle); t: the ticket (+ 1)


cdef enum:
    MARK_SLOT = 1         # _ticket_mark: the marker is in the ticket's slot line
    MARK_PREC = 2         # ... in its owner's prec (omark): the slot's was taken


cdef class TicketLock(_Lock):
    # overrides _fast, _try, _wait, _unlock, _is_locked (base/kind.pxd); adds:
    cdef bint _take_back(self, uint32_t me) noexcept nogil
    cdef int _park(self, ready_fn ready, dep_fn dep, _ticket_ctx* ctx, shm_tslot* nd,
                   wait_t* w, uint32_t arg=*) noexcept nogil
    cdef int _settle_inherited(self, uint32_t me, wait_t* w) noexcept nogil
    cdef int _abandon(self, uint32_t me, uint64_t t) noexcept nogil
