# cython: language_level=3
"""shmlocks._core -- the compiled core, one extension built from one file per concern:

  _ext/sys.pxi           foreign declarations (layout ABI, atomics, futex, pthread, mmap)
  _ext/participants.pxi  participant slots, liveness tokens, thread exit, fork
  _ext/wait.pxi          the one waiting policy
  _ext/region.pxi        the segment: create/open/validate, directory, lifetime
  _ext/lockbase.pxi      the internal lock interface and the Python API on top of it
  _ext/{ticket,mcs,clh,futex,robust,pi}.pxi   one file per algorithm
"""

from shmlocks.errors import (CapacityError, CorruptRegionError, DeadlockError,
                             LockKindError, LockNotRecoverableError, NotOwnerError,
                             ShmLockError)

include "_ext/sys.pxi"
include "_ext/participants.pxi"
include "_ext/wait.pxi"
include "_ext/region.pxi"
include "_ext/lockbase.pxi"
include "_ext/ticket.pxi"
include "_ext/mcs.pxi"
include "_ext/clh.pxi"
include "_ext/futex.pxi"
include "_ext/robust.pxi"
include "_ext/pi.pxi"

CACHE_LINE = SHM_LINE
LAYOUT_VERSION = SHM_VERSION
MAGIC = SHM_MAGIC

KINDS = {
    "ticket": TicketLock,
    "mcs": MCSLock,
    "clh": CLHLock,
    "futex": FutexMutex,
    "robust": RobustMutex,
    "pi": PIMutex,
}

participants_init()
