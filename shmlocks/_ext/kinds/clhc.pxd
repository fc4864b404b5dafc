# clhc.pxd -- the compact CLH stripe of a lock table (docs/design.md §15): the interface of
# clhc.pxi (its word table, invariant and death table: the top of clhc.pxi). A lock body's
# clh lock is clh.pxi, unchanged; this is the same kind (kind_code, FIFO, node states,
# abandonment, stepping aside) on one 128-byte line, over a node pool its table shares.

cdef enum:
    CH_SNODE = 0x40000000         # node id CH_SNODE | lock number: the node that starts in
    CH_SMASK = 0x3fffffff         # that stripe's line (ids 1..P: the participants' nodes)


# The stripe's words (its line's waiters' half, shm_layout.h SHM_STRIPE_CLH_*): word A is
# the tail (queue.pxd's codec), word B the head (the view aims wb at it).
cdef inline uint64_t* ch_tail(shm_body* b) noexcept nogil:
    return &b.wa.u64[0]


cdef inline uint64_t* ch_head(shm_body* b) noexcept nogil:
    return &b.wb.u64[0]


cdef inline char* ch_line(shm_body* b, uint32_t lk) noexcept nogil:
    """The line of the stripe whose lock number is lk, from the view b of a stripe of the
    same table (the caller checked lk: _ch_stripe_ok)."""
    return <char*>b.ctl + (<int64_t>lk - <int64_t>b.index) * <int64_t>(SHM_STRIPE_LINES * SHM_LINE)


cdef inline shm_cnode* ch_node(shm_body* b, uint32_t X) noexcept nogil:
    """Node X of the table's pool (the caller checked X: _ch_ok)."""
    if (X >> 30) == 1:
        return <shm_cnode*>(ch_line(b, X & CH_SMASK) + SHM_STRIPE_CLH_NODE_OFF)
    return <shm_cnode*>&b.qnodes[X - 1]


cdef struct ch_wait_t:    # a waiter's ready context: what its last look saw (_ch_look)
    shm_cnode* n          # the node it waits on: its pred, or the first one not aside below
    uint32_t n_st         # n's state then
    shm_cnode* top        # the node aside right above n (NULL: n is its pred)
    uint32_t top_st       # its state then (an aside state)
    uint32_t dep          # the node whose owner it depends on: n if BUSY, else top's
    shm_body* b
    rmap_t* rm


cdef void _ch_recall(rmap_t* rm, shm_body* b, uint32_t X) noexcept nogil
cdef void _ch_recall_succ(rmap_t* rm, shm_body* b, uint32_t X, uint32_t s) noexcept nogil


cdef class CLHStripe(CLHLock):
    # overrides _fast, _try, _wait, _unlock, _is_locked, _aside_end (base/kind.pxd); adds:
    cdef int _ch_enqueue(self, uint32_t me, uint32_t X, bint armed) noexcept nogil

# the recovery of a dead participant on a compact stripe, and its init (the ops entry's
# stripe_recover and stripe_init: base/kind.pxd _register_stripe)
cdef void _ch_recover(rmap_t* rm, shm_body* b, uint32_t q, recov_t* rec) noexcept nogil
cdef void _ch_init(shm_body* b) noexcept nogil
