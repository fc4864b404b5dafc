# kind.pxi -- the kind registry: the ops table and the classes each kind registers
# (the contract it implements: kind.pxd).

cdef kind_ops_t g_kind_ops[SHM_KIND_MAX + 1]
cdef list _KIND_CLASSES = []
cdef dict _KIND_BY_CODE = {}            # kind code -> its class
cdef kind_bind_fn g_kind_bind = NULL


cdef kind_ops_t* kind_ops(uint32_t code) noexcept nogil:
    """The ops of kind `code` (read from shared memory: checked), or NULL if unknown."""
    if code == 0 or code > SHM_KIND_MAX or g_kind_ops[code].recover == NULL:
        return NULL
    return &g_kind_ops[code]


cdef uint32_t _ops_fill(type cls, kind_init_fn init, kind_recover_fn recover,
                        bint repair, kind_grow_fn grow=NULL, uint32_t fixed_nodes=0) except 0:
    """Fill the ops-table entry of cls.kind_code (a lock kind's or a toolbox object's)."""
    cdef uint32_t code = cls.kind_code
    if code == 0 or code > SHM_KIND_MAX or g_kind_ops[code].recover != NULL:
        raise RuntimeError(f"kind code {code} of {cls.__name__} is out of range or taken")
    g_kind_ops[code].init = init
    g_kind_ops[code].recover = recover
    g_kind_ops[code].repair = repair
    g_kind_ops[code].grow = grow
    g_kind_ops[code].fixed_nodes = fixed_nodes
    g_kind_ops[code].stripe_recover = NULL
    g_kind_ops[code].stripe_init = NULL
    return code


cdef int _register_kind(type cls, kind_init_fn init, kind_recover_fn recover,
                        bint repair, kind_grow_fn grow=NULL, uint32_t fixed_nodes=0) except -1:
    cdef uint32_t code = _ops_fill(cls, init, recover, repair, grow, fixed_nodes)
    _KIND_CLASSES.append(cls)
    _KIND_BY_CODE[code] = cls
    return 0


cdef uint32_t kind_code_of(kind) except 0:
    """The code of `kind`: a registered kind's name or class (or a subclass of one)."""
    names = [c.kind_name for c in _KIND_CLASSES]
    if isinstance(kind, type):
        for c in _KIND_CLASSES:
            if issubclass(kind, c):
                kind = kind.kind_name
                break
    if not isinstance(kind, str):
        raise TypeError(f"kind must be one of {names} or a lock class, not {kind!r}")
    for c in _KIND_CLASSES:
        if c.kind_name == kind:
            return c.kind_code
    raise ValueError(f"unknown lock kind {kind!r}: expected one of {names}")


cdef object kind_new_lock(uint32_t code, object region, uint32_t index, object name):
    """The lock object for lock `index` of `region`, of the class registered for kind
    `code` (read from the segment), or None if no kind has that code."""
    cls = _KIND_BY_CODE.get(code)
    if cls is None or g_kind_bind == NULL:
        return None
    return g_kind_bind(<type>cls, region, index, name)


cdef dict _STRIPE_BY_CODE = {}          # kind code -> its compact stripes' class, if its own


cdef int _register_stripe(type cls, kind_recover_fn recover,
                          kind_init_fn init=NULL) except -1:
    """cls (a subclass of its kind's class, same kind_code, registered before) is the class
    of a compact stripe of that kind, `recover` its recover and `init` its init if not the
    body's (docs/design.md §15): a protocol of its own on a stripe's line."""
    cdef uint32_t code = cls.kind_code
    if code == 0 or code > SHM_KIND_MAX or g_kind_ops[code].recover == NULL:
        raise RuntimeError(f"{cls.__name__}: its kind is not registered")
    g_kind_ops[code].stripe_recover = recover
    g_kind_ops[code].stripe_init = init
    _STRIPE_BY_CODE[code] = cls
    return 0


cdef object kind_new_stripe(uint32_t code, object region, uint32_t index, object name):
    cls = _STRIPE_BY_CODE.get(code)
    if cls is None:
        return kind_new_lock(code, region, index, name)
    if g_kind_bind == NULL:
        return None
    return g_kind_bind(<type>cls, region, index, name)


# The synchronization toolbox's objects (docs/design.md §12) live in the directory beside
# the locks, with kind codes of their own and entries in the same ops table (their init,
# and the recovery of a dead participant's part in them), but are not locks: not in KINDS.
# The toolbox layer registers them (_register_object) and fills g_tb_api with what
# Region's toolbox methods call, so the region names none of them.
cdef dict _OBJ_BY_CODE = {}             # object kind code -> its class
cdef dict g_tb_api = {}                 # Region method name -> the toolbox's function


cdef int _register_object(type cls, kind_init_fn init, kind_recover_fn recover,
                          bint repair) except -1:
    # every object keeps its journal (and a condition its lock's reference) in its first
    # SHM_FIXED_NODES node lines (shm_toolbox.h)
    _OBJ_BY_CODE[_ops_fill(cls, init, recover, repair, NULL, SHM_FIXED_NODES)] = cls
    return 0


cdef object kind_new_object(uint32_t code, object region, uint32_t index, object name):
    """The toolbox object for entry `index` of `region`, or None if `code` is no object's."""
    cls = _OBJ_BY_CODE.get(code)
    if cls is None:
        return None
    return cls._at(region, index, name)
