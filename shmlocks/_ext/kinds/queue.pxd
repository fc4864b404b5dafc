# queue.pxd -- what the queue locks (MCS, CLH) share: the interface of queue.pxi. Node ids
# are index + 1, 0 = none (shm_layout.h).

cdef struct node_wait_t:   # a queue lock's ready-function context (MCS, CLH)
    shm_qnode* n           # the node whose state the waiter watches
    shm_qnode* nodes       # the lock's nodes, for the far hint (an id read from shm)
    uint32_t count         # how many: ids 1..count


cdef enum:
    QUEUE_NONE = 0xfffffffe    # no successor found (an id never stored in a node)
    QUEUE_UNKNOWN = SHM_ID_UNKNOWN  # a pred not yet published (M_UNKNOWN, C_UNKNOWN)


cdef uint32_t queue_named_succ(shm_qnode* nodes, uint32_t count,
                               uint32_t target, uint32_t queued) noexcept nogil
cdef uint32_t queue_succ_of(uint64_t* tail, shm_qnode* nodes, uint32_t count,
                            uint32_t target, uint32_t queued) noexcept nogil


cdef inline uint32_t queue_link(shm_qnode* n) noexcept nogil:
    """A node's predecessor as far as is known: published, else its guess (right once it
    joined). An id read from shared memory: the caller bounds-checks it."""
    cdef uint32_t p = ld32_acq(&n.pred)
    return ld32_acq(&n.guess) if p == QUEUE_UNKNOWN else p


# The queue tail (word A of MCS and CLH): last | prev << 32, the last node to join and ITS
# predecessor (node ids: index + 1). One encoder, one decoder per part.
cdef inline uint64_t tail_encode(uint32_t last, uint32_t prev) noexcept nogil:
    return last | (<uint64_t>prev << 32)


cdef inline uint32_t tail_last(uint64_t t) noexcept nogil:
    return <uint32_t>(t & 0xffffffffU)


cdef inline uint32_t tail_prev(uint64_t t) noexcept nogil:
    return <uint32_t>(t >> 32)


# The pass record a participant publishes in op_value while it passes the lock on or
# reclaims a node (MCS, CLH): node id | the node's round << 32.
cdef inline uint64_t pass_encode(uint32_t node, uint32_t round) noexcept nogil:
    return node | (<uint64_t>round << 32)


cdef inline uint32_t pass_node(uint64_t v) noexcept nogil:
    return <uint32_t>(v & 0xffffffffU)


cdef inline uint32_t pass_round(uint64_t v) noexcept nogil:
    return <uint32_t>(v >> 32)
