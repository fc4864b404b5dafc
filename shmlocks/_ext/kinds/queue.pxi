# queue.pxi -- finding a queue node's successor from the tail (MCS and CLH)
#
# Invariant: every node that joined the queue knows its predecessor from the instant it
# joined: before each tail CAS its owner writes the tail's last into node.guess, so when
# the CAS wins the guess is its pred. Walking back from the tail through each node's link
# (its published pred, else its guess) therefore passes only through nodes that joined,
# and finds the node that came right after any queued node, even when the owners of
# several nodes in a row died between their tail CAS and publishing their pred (the next
# joiner's help, which publishes its predecessor's pred from the tail word, dies too then).


cdef uint32_t queue_named_succ(shm_body* b, uint32_t own,
                               uint32_t target, uint32_t queued) noexcept nogil:
    """A node whose state is in `queued` and that names `target` as its published pred
    (node ids: index + 1, shm_layout.h), else QUEUE_NONE: one pass over the nodes in use
    (the participants provisioned, and `own`: queue_node_ok), no walk."""
    cdef shm_qnode* nodes = b.qnodes
    cdef uint32_t h = body_hwm(b)
    cdef uint32_t i, x, st
    for i in range(h + 1):
        if i < h:
            x = i
        elif own != 0:
            x = own - 1                          # the lock's own node, last
        else:
            break
        if x + 1 == target:
            continue
        st = ld32_acq(&nodes[x].state)
        if queue_state_in(st, queued) and ld32_acq(&nodes[x].pred) == target:
            return x + 1
    return QUEUE_NONE


cdef uint32_t queue_succ_of(uint64_t* tail, shm_body* b, uint32_t own,
                            uint32_t target, uint32_t queued) noexcept nogil:
    """The node that joined right after `target` (node ids: index + 1, as the tail's
    low 32 bits and the pred fields store them), or QUEUE_NONE if no node that joined
    names it. Walks back from the tail's last, only through nodes whose state is in the
    bitmask `queued`. A walk that goes round in circles (a node left and joined again
    while we walked) starts over, a few times; every id read is bounds-checked
    (queue_node_ok: a participant provisioned, or `own`)."""
    cdef shm_qnode* nodes = b.qnodes
    cdef uint32_t id, link, st, steps, attempt
    for attempt in range(4):
        id = tail_last(ld64_seq(tail))
        steps = 0
        while steps <= body_hwm(b) + 1:
            if id == target or not queue_node_ok(b, id, own):
                return QUEUE_NONE                # (reached target: it is last)
            st = ld32_acq(&nodes[id - 1].state)
            if not queue_state_in(st, queued):
                return QUEUE_NONE
            link = queue_link(&nodes[id - 1])
            if link == target:
                return id
            id = link
            steps += 1
        sched_yield()
    return QUEUE_NONE
