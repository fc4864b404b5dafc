# futex.pxd -- three-state futex mutex: the interface of futex.pxi (the kind contract it
# implements: base/kind.pxd; its word: the top of futex.pxi).

# The futex mutex's word, named as qspinlock_types.h names the parts of its word:
#   word A  u32 state   0 free, else owner | FX_W: owner the holder's participant index + 1
#                       (bits 0-30, _fx_owner1), FX_W (bit 31) "a waiter may be parked"
#   word B              unused
cdef inline uint32_t* fx_state(shm_body* b) noexcept nogil:
    return &b.wa.u32[0]


cdef class FutexMutex(_Lock):
    # overrides _fast, _try, _wait, _unlock, _is_locked (base/kind.pxd)
    pass
