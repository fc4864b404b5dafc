# cython: language_level=3
# shmlocks/_core.pxd -- the declarations of the compiled core: each unit's .pxd, in layer
# order, bottom first (docs/design.md §1); _core.pyx includes the units' definitions in the
# same order. A unit uses only what the units before it declare (tests/test_layers.py).

include "_ext/sys/sys.pxd"
include "_ext/base/kind.pxd"
include "_ext/base/participants.pxd"
include "_ext/base/uring.pxd"
include "_ext/base/wait.pxd"
include "_ext/base/region.pxd"
include "_ext/diag/stats.pxd"
include "_ext/diag/lockdep.pxd"
include "_ext/diag/deadlock.pxd"
include "_ext/lock/lockbase.pxd"
include "_ext/kinds/queue.pxd"
include "_ext/kinds/ticket.pxd"
include "_ext/kinds/mcs.pxd"
include "_ext/kinds/clh.pxd"
include "_ext/kinds/futex.pxd"
include "_ext/kinds/robust.pxd"
include "_ext/kinds/pi.pxd"
include "_ext/table/table.pxd"
include "_ext/toolbox/toolbox.pxd"
include "_ext/toolbox/event.pxd"
include "_ext/toolbox/semaphore.pxd"
include "_ext/toolbox/barrier.pxd"
include "_ext/toolbox/condition.pxd"
include "_ext/toolbox/rwlock.pxd"
