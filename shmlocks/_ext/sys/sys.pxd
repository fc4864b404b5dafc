# sys.pxd -- every foreign declaration in one place: the layout ABI (shm_layout.h), atomics,
# futex(2), clocks, crash points and the per-thread state of waits and recoveries
# (shm_sys.h), the debug build's assertions (shm_debug.h), pthread robust/PI mutexes, mmap,
# the CPython calls. The bottom layer: it uses nothing of the core (docs/design.md §1).

from libc.stdint cimport uint32_t, uint64_t, int64_t, int32_t
from libc.string cimport memset, memcpy, strncmp, strlen
from libc.stdlib cimport malloc, free, calloc, realloc
from posix.stat cimport struct_stat, stat, fstat, lstat
from libc.errno cimport errno, EBUSY, EAGAIN, EINTR, ETIMEDOUT, EPERM, EINVAL

cdef extern from "<string.h>" nogil:
    size_t strnlen(const char*, size_t)

cdef extern from "<time.h>" nogil:
    ctypedef int clockid_t
    cdef struct timespec:
        long tv_sec
        long tv_nsec
    enum: CLOCK_MONOTONIC

cdef extern from "<errno.h>" nogil:
    enum: EOWNERDEAD
    enum: ENOTRECOVERABLE

cdef extern from "<unistd.h>" nogil:
    int getpid()
    int close(int fd)
    int unlink(const char* path)
    int linkat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, int flags)

cdef extern from "<fcntl.h>" nogil:
    int c_open "open"(const char* path, int flags)
    enum: O_RDWR
    enum: O_CLOEXEC
    enum: AT_FDCWD
    enum: AT_SYMLINK_FOLLOW

cdef extern from "<sys/file.h>" nogil:
    int flock(int fd, int op)
    enum: LOCK_SH
    enum: LOCK_EX
    enum: LOCK_NB
    enum: LOCK_UN

cdef extern from "<signal.h>" nogil:
    ctypedef struct sigset_t:
        pass
    ctypedef void (*shm_sighandler "__sighandler_t")(int) noexcept nogil
    cdef struct c_sigaction "sigaction":
        shm_sighandler sa_handler
        sigset_t sa_mask
        int sa_flags
    int c_sigaction_call "sigaction"(int sig, const c_sigaction* act, c_sigaction* old)
    int sigemptyset(sigset_t* s)
    int c_raise "raise"(int sig)
    int c_kill "kill"(int pid, int sig)
    enum: SIGTERM
    enum: SA_RESTART
    shm_sighandler SIG_DFL

cdef extern from "<stdio.h>" nogil:
    int snprintf(char* buf, size_t size, const char* fmt, ...)

cdef extern from "<sched.h>" nogil:
    int sched_yield()
    int sched_getscheduler(int pid)
    enum: SCHED_FIFO
    enum: SCHED_RR

cdef extern from "<sys/mman.h>" nogil:
    int shm_unlink(const char* name)
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void* addr, size_t length)
    enum: PROT_READ
    enum: PROT_WRITE
    enum: MAP_SHARED
    enum: MAP_ANONYMOUS
    void* MAP_FAILED

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_mutexattr_t:
        pass
    ctypedef unsigned int pthread_key_t
    enum: PTHREAD_PROCESS_SHARED
    enum: PTHREAD_MUTEX_ROBUST
    enum: PTHREAD_PRIO_INHERIT
    enum: PTHREAD_MUTEX_NORMAL
    int pthread_mutexattr_init(pthread_mutexattr_t*)
    int pthread_mutexattr_destroy(pthread_mutexattr_t*)
    int pthread_mutexattr_setpshared(pthread_mutexattr_t*, int)
    int pthread_mutexattr_setrobust(pthread_mutexattr_t*, int)
    int pthread_mutexattr_setprotocol(pthread_mutexattr_t*, int)
    int pthread_mutexattr_settype(pthread_mutexattr_t*, int)
    int pthread_mutex_init(pthread_mutex_t*, const pthread_mutexattr_t*)
    int pthread_mutex_lock(pthread_mutex_t*)
    int pthread_mutex_trylock(pthread_mutex_t*)
    int pthread_mutex_unlock(pthread_mutex_t*)
    int pthread_mutex_consistent(pthread_mutex_t*)
    int pthread_mutex_clocklock(pthread_mutex_t*, clockid_t, const timespec*)
    int pthread_key_create(pthread_key_t*, void (*)(void*) noexcept nogil)
    void* pthread_getspecific(pthread_key_t)
    int pthread_setspecific(pthread_key_t, const void*)
    int pthread_atfork(void (*)() noexcept nogil, void (*)() noexcept nogil, void (*)() noexcept nogil)

cdef extern from "shm_layout.h" nogil:
    enum: SHM_LINE
    enum: SHM_VERSION
    enum: SHM_NAME_MAX
    enum: SHM_MAX_PARTICIPANTS
    enum: SHM_HWM_FIRST
    enum: SHM_FIXED_NODES
    enum: SHM_TICKET_SLOTS
    enum: SHM_MAX_LOCKS
    enum: SHM_STATE_BUILDING
    enum: SHM_STATE_READY
    enum: SHM_HDR_PERSIST
    enum: SHM_DIRENT_FREE
    enum: SHM_DIRENT_READY
    enum: SHM_KIND_TICKET
    enum: SHM_KIND_MCS
    enum: SHM_KIND_CLH
    enum: SHM_KIND_FUTEX
    enum: SHM_KIND_ROBUST
    enum: SHM_KIND_PI
    enum: SHM_KIND_TABLE
    enum: SHM_KIND_MAX
    enum: SHM_F_OWNER_DIED
    enum: SHM_F_NOTRECOVERABLE
    enum: SHM_F_HANDON
    enum: SHM_LINK_DETECTS
    enum: SHM_BODY_MAGIC
    enum: SHM_BODY_NODES
    uint64_t SHM_MAGIC

    ctypedef union shm_mutex_line "union { pthread_mutex_t m; char _pad[SHM_LINE]; }":
        pthread_mutex_t m
    ctypedef union shm_mutex_repair "union { pthread_mutex_t m; char _pad[SHM_LINE / 2 - 16]; }":
        pthread_mutex_t m
    enum: SHM_OP_TAKING
    enum: SHM_OP_WAITING
    enum: SHM_OP_RELEASING
    enum: SHM_OP_QUARANTINED

    ctypedef struct shm_header:
        uint64_t magic
        uint32_t version
        uint32_t line_size
        uint64_t total_size
        uint32_t max_locks
        uint32_t max_participants
        uint64_t dir_off
        uint64_t part_off
        uint64_t locks_off
        uint64_t lock_stride
        uint32_t state
        uint32_t creator_pid
        uint32_t nlocks
        uint32_t glibc_mutex_size
        uint64_t creator_pidns
        uint32_t flags
        uint32_t part_hwm
        uint64_t order_key
        uint64_t ext_lines
        shm_mutex_line dir_mutex

    ctypedef struct shm_dirent:
        uint32_t state
        uint32_t kind
        char name[56]

    ctypedef struct shm_participant:
        shm_mutex_line token
        uint32_t pid
        uint32_t tid
        uint32_t op_lock
        uint32_t op_step
        uint64_t op_value
        uint64_t generation
        uint32_t pending
        uint32_t detects
        uint64_t pidns
        uint64_t wait_since
        uint64_t tstart
        uint32_t poke
        uint32_t agent
        uint32_t tasks
        uint64_t task_id
        char label[40]
        uint32_t link_seq
        uint32_t link_lock
        uint64_t link_since
        char link_name[201]
        uint32_t link_slot
        uint64_t link_gen
        uint32_t link_flags

    ctypedef struct shm_lockctl:
        uint32_t kind
        uint32_t flags
        uint32_t holder
        uint32_t magic
        uint64_t acquisitions
        uint64_t handoffs
        uint64_t contended
        uint64_t wait_total_ns
        uint64_t wait_max_ns
        uint32_t last_pid
        uint32_t owner_deaths
        shm_mutex_repair repair
        uint32_t timeouts
        uint32_t _wb[3]

    ctypedef union shm_word:
        uint32_t u32[32]
        uint64_t u64[16]
        pthread_mutex_t m

    enum: SHM_ID_UNKNOWN

    ctypedef struct shm_qnode:
        uint32_t state
        uint32_t next
        uint32_t pred
        uint32_t parked
        uint64_t left_gen
        uint32_t round
        uint32_t guess
        uint32_t lock1

    ctypedef struct shm_cnode:
        uint32_t state
        uint32_t lock1
        uint32_t pred
        uint32_t parked
        uint32_t left_gen
        uint32_t round
        uint32_t guess

    ctypedef struct shm_tslot:
        uint32_t grants
        uint32_t overflow
        uint32_t parked
        uint64_t abandoned
    uint64_t SHM_TICKET_SKIP

    ctypedef struct shm_prec:
        uint32_t mine
        uint32_t pred
        uint64_t ticket
        uint64_t abandoned
        uint64_t abandoned_gen
        uint32_t spin_ns
        uint32_t round
        uint64_t omark
        uint64_t aside_since
        uint32_t aside_wake
        uint32_t qd
        uint64_t hpass

    ctypedef struct shm_body:
        shm_lockctl* ctl
        shm_word* wa
        shm_word* wb
        shm_qnode* qnodes
        shm_prec* precs
        uint32_t* hwm
        uint32_t P
        uint32_t index
        uint32_t hwm_seen

    shm_tslot* shm_tslots(shm_body* b)
    bint shm_view_compact(const shm_body* b)
    uint64_t shm_body_lines(uint32_t P)
    uint32_t shm_fixed_nodes(uint32_t fixed, uint32_t P)
    shm_body shm_body_at(char* base, uint64_t off, uint32_t P, uint32_t index)

    enum: SHM_TABLE_MAX
    enum: SHM_STRIPE_LINES
    enum: SHM_STRIPE_WA_OFF
    enum: SHM_MUTEX_U32
    enum: SHM_STRIPE_WB_OFF
    enum: SHM_STRIPE_TICKET_WB_OFF
    enum: SHM_STRIPE_ASIDE_OFF
    enum: SHM_STRIPE_SEATS
    enum: SHM_STRIPE_CLH_HEAD_OFF
    enum: SHM_STRIPE_CLH_NODE_OFF
    enum: SHM_STRIPE_CLH_ASIDE_OFF
    enum: SHM_STRIPE_CLH_SEATS
    ctypedef struct shm_table:
        uint32_t sub
        uint32_t size
        uint32_t first
        uint32_t compact
        uint64_t off
        uint64_t stride
    shm_body shm_stripe_at(char* base, const shm_table* t, const shm_body* tbody, uint32_t s)

cdef extern from "shm_hash.h" nogil:
    uint64_t SHM_HASH_TUPLE_SEED
    uint64_t shm_xxh64(const void* data, size_t n, uint64_t seed)
    uint32_t shm_hash_index(uint64_t h, uint32_t size)
    int shm_int_bytes(int64_t v, unsigned char* out)

cdef extern from "shm_sys.h" nogil:
    uint32_t ld32_acq(uint32_t*)
    uint32_t ld32_rlx(uint32_t*)
    uint32_t ld32_seq(uint32_t*)
    void st32_rel(uint32_t*, uint32_t)
    void st32_rlx(uint32_t*, uint32_t)
    void st32_seq(uint32_t*, uint32_t)
    uint32_t xchg32(uint32_t*, uint32_t)
    bint cas32(uint32_t*, uint32_t, uint32_t)
    uint32_t cmpxchg32(uint32_t*, uint32_t, uint32_t)
    uint32_t fadd32(uint32_t*, uint32_t)
    uint32_t fsub32(uint32_t*, uint32_t)
    uint32_t for32(uint32_t*, uint32_t)
    uint32_t fand32(uint32_t*, uint32_t)
    uint64_t ld64_acq(uint64_t*)
    uint64_t ld64_rlx(uint64_t*)
    uint64_t ld64_seq(uint64_t*)
    void st64_rel(uint64_t*, uint64_t)
    void st64_rlx(uint64_t*, uint64_t)
    void st64_seq(uint64_t*, uint64_t)
    uint64_t fadd64(uint64_t*, uint64_t)
    bint cas64(uint64_t*, uint64_t, uint64_t)
    uint64_t cmpxchg64(uint64_t*, uint64_t, uint64_t)
    void cpu_relax()
    int shm_futex_wait(uint32_t* word, uint32_t expected, int64_t timeout_ns)
    int shm_futex_wake(uint32_t* word, int n)
    enum: SHM_WAITV_MAX
    int shm_futex_waitv(uint32_t** words, const uint32_t* vals, int n, int64_t deadline_ns)
    void* shm_robust_pending_set(uint32_t* word)
    void shm_robust_pending_clear(void* head)
    int64_t shm_now_ns()
    timespec shm_ts_of_ns(int64_t ns)
    uint32_t shm_gettid()
    int shm_crash_armed
    int shm_crash_signal
    int shm_crash_fired
    long shm_crash_skip
    uint64_t shm_crash_only_ino
    uint32_t shm_crash_only_lock1
    enum: SIGSTOP
    char shm_crash_name[64]
    void* shm_tls_get()
    void shm_tls_set(void*)
    void crashpoint "shm_crashpoint"(const char* name)
    void crashpoint_at "shm_crashpoint_at"(bint armed, const char* name)
    void crashpoint_lock_at "shm_crashpoint_lock_at"(bint armed, const char* name, uint64_t ino,
                                                      uint32_t lock1)
    void shm_op_set(uint32_t* op_lock, uint32_t lock1, uint32_t step)
    enum: SHM_WINDOW_MAX
    void* shm_win_rm[SHM_WINDOW_MAX]
    void* shm_win_reg[SHM_WINDOW_MAX]
    int shm_win_n
    ctypedef struct shm_trace_ent:
        uint64_t seq
        uint64_t what
        uint32_t pid
        uint32_t tid
        uint64_t a
        uint64_t b
        uint64_t c
    shm_trace_ent* shm_trace_ring
    uint64_t* shm_trace_count
    uint64_t shm_trace_mask
    enum: SHM_TRACE_BUILT
    void trace "shm_trace"(const char* what, uint64_t a, uint64_t b, uint64_t c)
    # glibc mutexes in the segment: every call on one goes through these guards, which
    # refuse (SHM_PM_CORRUPT) a mutex whose fields would reach a glibc assert (shm_sys.h)
    enum: SHM_PM_CORRUPT
    void shm_pm_learn_kinds(pthread_mutex_t* robust, pthread_mutex_t* pi)
    int pm_trylock "shm_pm_trylock"(pthread_mutex_t* m, bint pi)
    int pm_clocklock "shm_pm_clocklock"(pthread_mutex_t* m, bint pi, const timespec* ts)
    int pm_unlock "shm_pm_unlock"(pthread_mutex_t* m, bint pi)
    int pm_consistent "shm_pm_consistent"(pthread_mutex_t* m, bint pi)
    bint pm_kind_ok "shm_pm_kind_ok"(pthread_mutex_t* m, bint pi)

# the deadlock chain walk (docs/design.md §9): C, no GIL, bounded; it reads the walker's
# own region through its mapping and any other segment with pread (shm_walk.h)
cdef extern from "shm_walk.h" nogil:
    const char* SHM_WALK_DIR
    enum: DLW_NONE
    enum: DLW_VICTIM
    enum: DLW_OTHER
    enum: DLW_DEPTH
    enum: DLW_NODES
    enum: DLW_SEGS
    ctypedef struct dlw_src:
        const char* base
        const uint32_t* hwmp
        int fd
        int state
        uint64_t size
        uint64_t dir_off
        uint64_t part_off
        uint64_t locks_off
        uint64_t stride
        uint32_t L
        uint32_t P
        uint32_t hwm
        char name[201]
        uint64_t ext_off
        shm_table tbl
        int tbl_state
    void shm_walk_trust(const uint32_t* uids, int n)
    int shm_walk(const dlw_src* mine, uint32_t slot, uint32_t lock, uint64_t task,
                 int64_t since, int detects, int64_t now, char** text, int* members)
    void shm_fence_seq()
    void* shm_tls_dlwait_get()
    void shm_tls_dlwait_set(void*)

# futex waits through io_uring (Linux 6.7+): a thread that must not block arms a wait on a
# watch set and is told by a completion (docs/design.md §5 "Resumable waits")
cdef extern from "shm_uring.h" nogil:
    cdef struct shm_waitv:
        uint64_t val
        uint64_t uaddr
        uint32_t flags
        uint32_t reserved
    ctypedef struct shm_uring:
        int fd
        int efd
        unsigned sq_entries
        unsigned cq_entries
    void shm_uring_zero(shm_uring* r)
    int shm_uring_setup(shm_uring* r, unsigned entries, unsigned cq_entries)
    void shm_uring_close(shm_uring* r)
    int shm_uring_eventfd(shm_uring* r)
    int shm_uring_prep_waitv(shm_uring* r, shm_waitv* v, unsigned n, uint64_t user_data)
    int shm_uring_prep_cancel(shm_uring* r, uint64_t target, uint64_t user_data)
    void shm_waitv_fill(shm_waitv* e, uint32_t* word, uint32_t val)
    int shm_uring_enter(shm_uring* r, unsigned min_complete, int64_t deadline_ns)
    int shm_uring_submit(shm_uring* r)
    int shm_uring_reap(shm_uring* r, uint64_t* user_data, int32_t* res)
    uint64_t shm_uring_drain_eventfd(shm_uring* r)
    int shm_uring_probe()
    # a blocking sleep on more words than one futex_waitv takes (the toolbox's, §12)
    ctypedef struct shm_many:
        pass
    shm_many* shm_many_claim(uint64_t* gen)
    uint64_t shm_many_gen(shm_many* m)
    int shm_many_count(shm_many* m)
    uint32_t* shm_many_word(shm_many* m, int i)
    uint32_t shm_many_word_slot(shm_many* m, int i)
    int shm_many_add(shm_many* m, uint32_t* word, uint32_t val, uint32_t slot)
    int shm_many_sleep(shm_many* m, uint32_t** w1, const uint32_t* v1, int n1,
                       int64_t deadline_ns)
    enum: ETIME
    enum: ECANCELED
    enum: ENOSYS
    enum: EBADF

cdef extern from "shm_debug.h" nogil:
    enum: SHM_DEBUG_BUILT
    # an invariant of a state table, checked in SHMLOCKS_DEBUG builds only (not even
    # evaluated otherwise): keep `cond` free of side effects. Cython evaluates an `and`
    # or `or` into a temporary before the call: put such a dassert under
    # `if SHM_DEBUG_BUILT:` (a constant 0 in a normal build, so the C compiler drops it)
    void dassert "shm_assert"(bint cond, const char* what)

cdef extern from "Python.h":
    int PyErr_CheckSignals() nogil
    unsigned long PyThread_get_thread_ident() nogil
    ctypedef struct PyThreadState
    PyThreadState* PyEval_SaveThread() nogil
    void PyEval_RestoreThread(PyThreadState*) nogil

from cpython.exc cimport PyErr_Occurred, PyErr_SetObject

# the key encodings of a lock table's stable hash (_ext/table/table.pxi)
cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    long long PyLong_AsLongLongAndOverflow(object v, int* overflow) except? -1
    bint PyUnicode_Check(object o)
    bint PyBytes_Check(object o)
    bint PyLong_Check(object o)
    bint PyTuple_Check(object o)
    char* PyBytes_AS_STRING(object o)
    Py_ssize_t PyBytes_GET_SIZE(object o)
    Py_ssize_t PyTuple_GET_SIZE(object o)
from cpython.float cimport PyFloat_AsDouble

# the synchronization toolbox's views of an object body (docs/design.md §12)
cdef extern from "shm_toolbox.h" nogil:
    enum: SHM_KIND_EVENT
    enum: SHM_KIND_SEMAPHORE
    enum: SHM_KIND_BARRIER
    enum: SHM_KIND_CONDITION
    enum: TB_F_BOUNDED
    enum: TB_F_BREAK
    enum: TB_JMAX
    enum: TB_REF_NONE
    enum: TB_REF_STANDALONE
    enum: TB_REF_IN_REGION
    enum: TB_REF_RLOCK
    enum: TB_B_FILLING
    enum: TB_B_DRAINING
    enum: TB_B_RESETTING
    enum: TB_B_BROKEN
    enum: TB_GONE_BREAK
    enum: TB_GONE_LEAVE
    enum: TB_GONE_HELD
    enum: TB_GONE_DROP
    enum: TB_GONE_PASS
    enum: TB_GONE_USED
    enum: TB_N_GONE

    ctypedef struct shm_tbword:
        uint32_t seq
        uint32_t parked
        uint32_t value
        uint32_t limit
        uint32_t count
        uint32_t waiting
        uint64_t timeout_ns
        uint32_t flags
        uint32_t cycle
        uint32_t gone

    ctypedef struct shm_tbjent:
        uint32_t off
        uint32_t old

    ctypedef struct shm_tbjournal:
        uint32_t n
        shm_tbjent e[31]

    ctypedef struct shm_tbref:
        uint32_t how
        char region[248]
        char lock[56]

    ctypedef struct shm_tbrec:
        uint32_t units
        uint32_t inside
        uint32_t member
        uint32_t ticket
        uint32_t notified
        uint32_t parked
        uint32_t poke
        uint32_t waiting
        uint32_t gone
        uint32_t gone_cycle

    shm_tbword* shm_tb_word(shm_body* b)
    pthread_mutex_t* shm_tb_guard(shm_body* b)
    shm_tbjournal* shm_tb_journal(shm_body* b)
    shm_tbref* shm_tb_ref(shm_body* b)
    shm_tbrec* shm_tb_rec(shm_body* b, uint32_t p)

# the reader-writer lock's views of its body (docs/design.md §13)
cdef extern from "shm_rwlock.h" nogil:
    enum: SHM_KIND_RWLOCK
    enum: RW_PRESENT
    enum: RW_SLOT_BITS
    enum: RW_SLOT_MASK
    enum: RW_PHASE_MASK
    enum: RW_COUNT_MASK
    enum: RW_BLOCKED
    enum: RW_TAG_SHIFT
    enum: RW_TAG_MASK
    enum: RW_W_NONE
    enum: RW_W_DRAINING
    enum: RW_W_HOLDING
    enum: RW_W_RELEASING

    ctypedef struct shm_rwword:
        uint32_t w
        uint32_t parked
        uint32_t wwait

    ctypedef struct shm_rwrec:
        uint32_t ind
        uint32_t wparked
        uint32_t wstate
        uint32_t waiting
        uint64_t reads
        uint64_t read_waits
        uint64_t timeouts
        uint64_t read_wait_ns
        uint64_t read_wait_max_ns

    shm_rwword* shm_rw_word(shm_body* b)
    shm_rwrec* shm_rw_rec(shm_body* b, uint32_t p)
