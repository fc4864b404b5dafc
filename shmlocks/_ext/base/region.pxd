# region.pxd -- the segment (docs/design.md §2): the interface of region.pxi. One POSIX
# shared-memory object per region, laid out as shm_layout.h, validated before any use;
# its geometry copied into the process-local rmap_t (base/participants.pxd). The region
# makes lock objects only through the kind registry (base/kind.pxd: kind_new_lock).

cdef class Region:
    cdef rmap_t* rm
    cdef readonly str name
    cdef object __weakref__

    cdef _attach(self, str n, char* base, size_t size, int fd)
    cdef _discard(self, bint named)
    cdef int _check_open(self) except -1
    cdef _release_mine(self)
    cdef int _find(self, bytes bname) except -2
    cdef _lock_at(self, uint32_t i, name=*)
    cdef object _participant(self, uint32_t slot1)
