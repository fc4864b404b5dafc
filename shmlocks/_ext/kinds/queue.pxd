# queue.pxd -- what the queue locks (MCS, CLH) share: the interface of queue.pxi. Node ids
# are index + 1, 0 = none (shm_layout.h).

cdef struct node_wait_t:   # a queue lock's ready-function context (MCS, CLH)
    shm_qnode* n           # the node whose state the waiter watches
    shm_body* b            # the lock's body: its nodes, for the far hint (an id read from shm)
    uint32_t own           # the lock's own node id beside the participants' (CLH: P + 1), or 0


cdef enum:
    QUEUE_NONE = 0xfffffffe    # no successor found (an id never stored in a node)
    QUEUE_UNKNOWN = SHM_ID_UNKNOWN  # a pred not yet published (M_UNKNOWN, C_UNKNOWN)


cdef inline bint queue_state_in(uint32_t st, uint32_t queued) noexcept nogil:
    """Is node state st in the bitmask `queued` (bit st)? Every state from 30 up is bit
    30: CLH's waiter-aside states, which carry their round (clh.pxi C_ASIDE)."""
    return (queued >> (st if st < 30 else 30)) & 1


cdef uint32_t queue_named_succ(shm_body* b, uint32_t own,
                               uint32_t target, uint32_t queued) noexcept nogil
cdef uint32_t queue_succ_of(uint64_t* tail, shm_body* b, uint32_t own,
                            uint32_t target, uint32_t queued) noexcept nogil


cdef inline bint queue_node_ok(shm_body* b, uint32_t id, uint32_t own) noexcept nogil:
    """Does node id `id` (index + 1, read from shared memory) name a node in use: one of a
    participant provisioned (1..part_hwm: participants.pxd body_hwm), or the lock's own
    node `own` (CLH's P + 1; 0: none)? Unsigned: 0 (none) and QUEUE_UNKNOWN fail. Below
    this view's last count (b.hwm_seen: part_hwm only grows) it is in range at the cost
    of the cap's check, on the uncontended path too; past it the header is read again."""
    if id - 1 < ld32_rlx(&b.hwm_seen) or (own != 0 and id == own):
        return 1
    return id - 1 < body_hwm(b)


cdef inline uint32_t queue_link(shm_qnode* n) noexcept nogil:
    """A node's predecessor as far as is known: published, else its guess (right once it
    joined). An id read from shared memory: the caller bounds-checks it."""
    cdef uint32_t p = ld32_acq(&n.pred)
    return ld32_acq(&n.guess) if p == QUEUE_UNKNOWN else p


# Two 32-bit ids in one 64-bit word, the first in the low half: the one codec of the queue
# tail and the pass record below (node ids: index + 1).
cdef inline uint64_t id_pair(uint32_t lo, uint32_t hi) noexcept nogil:
    return lo | (<uint64_t>hi << 32)


cdef inline uint32_t pair_lo(uint64_t v) noexcept nogil:
    return <uint32_t>(v & 0xffffffffU)


cdef inline uint32_t pair_hi(uint64_t v) noexcept nogil:
    return <uint32_t>(v >> 32)


# Word A of MCS and CLH, named as qspinlock_types.h names the parts of its word:
#   word A  u64 tail   last | prev << 32: the last node to join, and ITS predecessor (CLH:
#                      SHM_ID_UNKNOWN once an abort stepped the last node out); taken by
#                      CAS, so a joiner's predecessor is known the instant it joins
#   word B             unused
cdef inline uint64_t* queue_tail(shm_body* b) noexcept nogil:
    return &b.wa.u64[0]


cdef inline uint64_t tail_encode(uint32_t last, uint32_t prev) noexcept nogil:
    return id_pair(last, prev)


cdef inline uint32_t tail_last(uint64_t t) noexcept nogil:
    return pair_lo(t)


cdef inline uint32_t tail_prev(uint64_t t) noexcept nogil:
    return pair_hi(t)


# The pass record a participant publishes in op_value while it passes the lock on or
# reclaims a node: the node and the node's round (which passage of it), node | round << 32.
cdef struct pass_t:
    uint32_t node
    uint32_t round


cdef inline uint64_t pass_encode(uint32_t node, uint32_t round) noexcept nogil:
    return id_pair(node, round)


cdef inline pass_t pass_decode(uint64_t v) noexcept nogil:
    cdef pass_t p
    p.node = pair_lo(v)
    p.round = pair_hi(v)
    return p
