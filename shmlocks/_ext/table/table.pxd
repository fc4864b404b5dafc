# table.pxd -- sharded locks (docs/design.md §15): the interface of table.pxi. A LockTable
# is `size` stripes of one kind in one segment (one directory entry of kind
# SHM_KIND_TABLE, its stripes in the extension area: shm_layout.h), chosen by a stable
# hash of the key (index_of); hold and hold_all take any set of locks in one global order.

cdef int key_hash(object key, uint64_t* h, int depth) except -1


cdef inline bint stripe_untouched(shm_body* b) noexcept nogil:
    """Are the first words of a stripe's lines A and B all zero (with no holder and no
    flag, every kind reads that as free: inspect's quick pass over a table)?"""
    return (ld32_acq(&b.ctl.holder) == 0 and ld32_acq(&b.ctl.flags) == 0
            and ld64_acq(&b.wa.u64[0]) == 0 and ld64_acq(&b.wb.u64[0]) == 0)


cdef class LockTable:
    cdef object _region               # the Region (a segment of one entry, "table")
    cdef rmap_t* rm
    cdef uint32_t _size
    cdef uint32_t _sub                # the stripes' kind code
    cdef list _stripes                # stripe lock objects, made on first use (None)
    cdef bint _closed
    cdef object __weakref__

    cdef object _stripe(self, uint32_t s)
    cdef int _check(self) except -1


cdef class Held:
    cdef list _locks                  # the distinct locks, in the global order
    cdef list _where                  # for each: what `died` reports (stripe, positions)
    cdef list _taken                  # those held now
    cdef list _died                   # of _where: the ones whose owner had died
    cdef object _timeout
    cdef bint _stripes                # a table's hold: `died` lists stripe indices

    cdef int _take(self) except -1
    cdef int _let_go(self, t, v, tb) except -1
