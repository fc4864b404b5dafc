"""The compiled core is layered (docs/design.md §1), and no unit uses one above it.

The core is one extension: shmlocks/_core.pyx includes the units' definitions
(shmlocks/_ext/<layer>/<unit>.pxi) and shmlocks/_core.pxd their declarations (the .pxd of
each unit), both in one order, bottom layer first. The layers are folders:

    sys    every foreign declaration (cdef extern, cimport) and the C headers
    base   the kind contract, participants, waiting, the region
    diag   statistics, the lockdep hook, the deadlock look
    lock   _Lock: the Python API on the kind hooks
    kinds  one unit per algorithm (and what the queue locks share)
    toolbox  the synchronization toolbox: its base, then one unit per primitive

The rule, checked here from the sources (no build needed):
  1. the include lists of _core.pyx and _core.pxd name the layers' folders in that order,
     each unit once, and no other file includes or cimports anything: a unit reaches what is
     below it only through the order of those two lists;
  2. `cdef extern` and `cimport` appear in the sys layer only;
  3. a unit uses no name declared by a unit after it in the order: each identifier in a
     unit's code (comments and strings left out, `x.name` attribute accesses too) that is a
     top-level declaration of a later unit (a function, class, struct, ctypedef, enum
     member, C or Python global, import alias) is an upward use. A name's unit is the first
     that declares it (a forward declaration `cdef struct x` declares it there). Local
     variables are not declarations, so a local that shadowed an upper unit's name would be
     reported too: rename it.
The checker itself is tested on an upward use made on purpose (last test).
"""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "shmlocks")
EXT = os.path.join(CORE, "_ext")
LAYERS = ["sys", "base", "diag", "lock", "kinds", "table", "toolbox"]

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(CORE, "_core.pyx")), reason="the core's sources are not here"
)

_STRING = re.compile(
    r"""(?P<s>[rRbBfFuU]{0,2}(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''"""
    r"""|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))|(?P<c>\#[^\n]*)""",
    re.S,
)
_IDENT = re.compile(r"(?<![\w.])([A-Za-z_]\w*)")
_INCLUDE = re.compile(r'^include\s+"([^"]+)"', re.M)


def strip(text: str) -> str:
    """The source with comments and string literals blanked (newlines kept)."""

    def blank(m: re.Match[str]) -> str:
        return (
            re.sub(r"[^\n]", " ", m.group(0))
            if m.group("c")
            else ('""' + "\n" * m.group(0).count("\n"))
        )

    return _STRING.sub(blank, text)


def includes(path: str) -> list[str]:
    """The files a root (_core.pyx, _core.pxd) includes, as paths relative to shmlocks/."""
    with open(path) as f:
        return [os.path.normpath(p) for p in _INCLUDE.findall(strip_keep_includes(f.read()))]


def strip_keep_includes(text: str) -> str:
    """Comments blanked, strings kept (an include names its file in a string)."""
    return re.sub(r"(?m)#[^\n\"']*$", "", text)


def unit_of(rel: str) -> str:
    """_ext/base/wait.pxi -> base/wait"""
    return os.path.splitext(os.path.relpath(rel, "_ext"))[0]


_DECL_LINE = [
    re.compile(r"^(?:cdef|cpdef)\s+(?:class|struct|union|enum)\s+(\w+)"),
    re.compile(r"^class\s+(\w+)"),
    re.compile(r"^(?:async\s+)?def\s+(\w+)"),
    re.compile(r"^ctypedef\s+[^(]*\(\s*\*\s*(\w+)\s*(?:\"\"\s*)?\)"),  # function pointer type
    re.compile(r"^ctypedef\s+(?:struct|union|enum)\s+(\w+)"),
    re.compile(r"^ctypedef\s+.*?(\w+)\s*(?:\"[^\"]*\"\s*)?:?\s*$"),
    re.compile(r"^(?:cdef|cpdef)\s+(?!extern\b)[\w\s.*\[\]]*?\b(\w+)\s*\("),  # function
]
_GLOBAL = re.compile(r"^cdef\s+(?!class\b|struct\b|union\b|enum\b|extern\b|inline\b)(.*)$")
_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)")
_IMPORT_AS = re.compile(r"\bas\s+(\w+)")
_FROM_IMPORT = re.compile(r"^from\s+\S+\s+c?import\s+\(?([\w\s,]+)\)?")
_MEMBER = re.compile(r"^\s+(?:enum:\s*)?([A-Za-z_]\w*)\s*(?:=|$)")
_EXTERN_DECL = [
    re.compile(r"^\s+(?:ctypedef|cdef)\s+(?:struct|union|enum)\s+(\w+)"),
    re.compile(r"^\s+ctypedef\s+[^(]*\(\s*\*\s*(\w+)\s*(?:\"\"\s*)?\)"),
    re.compile(r"^\s+ctypedef\s+.*?(\w+)\s*(?:\"[^\"]*\"\s*)?:?\s*$"),
    re.compile(r"^\s+enum:\s*(\w+)"),
    re.compile(r"^\s+(?:const\s+)?[\w*\s]+?[\s*(]+(\w+)\s*(?:\"[^\"]*\")?\s*\("),  # function
    re.compile(r"^\s+(?:const\s+)?[\w*\s]+?[\s*]+(\w+)\s*(?:\"[^\"]*\")?\s*(?:\[[^\]]*\])?\s*$"),
]


def logical_lines(code: str) -> list[str]:
    """The stripped code's lines, a bracketed continuation joined to its first line."""
    out: list[str] = []
    depth = 0
    for line in code.splitlines():
        if depth > 0:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
        depth = max(
            0, depth + line.count("(") + line.count("[") - line.count(")") - line.count("]")
        )
    return out


def declarations(code: str) -> set[str]:
    """The top-level names a unit's stripped code declares (see the module docstring)."""
    names: set[str] = set()
    block = None  # "enum" or "extern" while inside such a block
    block_indent = 0
    for line in logical_lines(code):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            block = None
            if re.match(r"^cdef\s+extern\b", line):
                block = "extern"
            elif re.match(r"^(?:cdef|cpdef)\s+enum\b[^:]*:\s*$", line):
                block = "enum"
            block_indent = 0
            for rx in _DECL_LINE:
                m = rx.match(line)
                if m:
                    names.add(m.group(1))
                    break
            else:
                g = _GLOBAL.match(line)
                if g:
                    body = re.sub(r"=.*$", "", g.group(1))
                    for part in body.split(","):
                        idents = re.findall(r"[A-Za-z_]\w*", re.sub(r"\[[^\]]*\]", "", part))
                        if idents:
                            names.add(idents[-1])
                m = _ASSIGN.match(line)
                if m:
                    names.add(m.group(1))
                if line.startswith("import "):
                    names.update(_IMPORT_AS.findall(line) or [line.split()[1].split(".")[0]])
                m = _FROM_IMPORT.match(line)
                if m:
                    for part in m.group(1).split(","):
                        if part.strip():
                            names.add(part.split()[-1])
            continue
        if block is None:
            continue
        if not block_indent:
            block_indent = indent
        if indent != block_indent:
            continue  # a struct's fields, a multi-line declaration's rest
        if block == "enum":
            m = _MEMBER.match(line)
            if m:
                names.add(m.group(1))
        else:
            for rx in _EXTERN_DECL:
                m = rx.match(line)
                if m:
                    names.add(m.group(1))
                    break
    return names


def used_names(code: str) -> set[str]:
    return set(_IDENT.findall(code))


def load_units() -> tuple[list[str], dict[str, list[str]], dict[str, str]]:
    """(units in include order, unit -> its files, file -> its text)."""
    order: list[str] = []
    files: dict[str, list[str]] = {}
    for root in ("_core.pxd", "_core.pyx"):
        path = os.path.join(CORE, root)
        if not os.path.exists(path):
            continue
        for rel in includes(path):
            u = unit_of(rel)
            if u not in order:
                order.append(u)
            files.setdefault(u, []).append(rel)
    texts = {}
    for fl in files.values():
        for rel in fl:
            with open(os.path.join(CORE, rel)) as f:
                texts[rel] = f.read()
    # _core.pyx itself: what it declares before its includes (the error classes) is below
    # every unit, what it declares after them (KINDS, the crash point table) above
    with open(os.path.join(CORE, "_core.pyx")) as f:
        pre, _, post = f.read().partition('\ninclude "')
    post = post.split("\n", 1)[1] if "\n" in post else ""
    order = [ROOT_PRE] + order + [ROOT_POST]
    files[ROOT_PRE], files[ROOT_POST] = [ROOT_PRE], [ROOT_POST]
    texts[ROOT_PRE], texts[ROOT_POST] = pre, _INCLUDE.sub("", post)
    return order, files, texts


ROOT_PRE = "_core.pyx (before its includes)"
ROOT_POST = "_core.pyx (after its includes)"


def rank_order(order: list[str]) -> list[str]:
    """A pxd-first walk appends units as it meets them: sort them back by layer, keeping
    each layer's own order."""

    def key(u: str) -> tuple[int, int]:
        if u == ROOT_PRE:
            return (-1, 0)
        if u == ROOT_POST:
            return (len(LAYERS), 0)
        return (LAYERS.index(u.split("/")[0]), order.index(u))

    return sorted(order, key=key)


def upward_uses(
    order: list[str], files: dict[str, list[str]], texts: dict[str, str]
) -> list[tuple[str, str, str]]:
    """(unit, name, the later unit that declares it) for every upward use."""
    owner: dict[str, str] = {}
    code = {rel: strip(t) for rel, t in texts.items()}
    for u in order:
        for rel in files[u]:
            for n in declarations(code[rel]):
                owner.setdefault(n, u)
    rank = {u: i for i, u in enumerate(order)}
    found = []
    for u in order:
        for rel in files[u]:
            for n in sorted(used_names(code[rel])):
                v = owner.get(n)
                if v is not None and rank[v] > rank[u]:
                    found.append((rel, n, v))
    return found


def test_the_include_lists_follow_the_layers():
    pyx = includes(os.path.join(CORE, "_core.pyx"))
    assert pyx, "_core.pyx includes no unit"
    for root in ("_core.pyx", "_core.pxd"):
        path = os.path.join(CORE, root)
        if not os.path.exists(path):
            continue
        rels = includes(path)
        units = [unit_of(r) for r in rels]
        assert len(units) == len(set(units)), f"{root} includes a unit twice: {units}"
        layers = [u.split("/")[0] for u in units]
        assert all(lay in LAYERS for lay in layers), f"{root}: a unit outside {LAYERS}: {units}"
        ranks = [LAYERS.index(lay) for lay in layers]
        assert ranks == sorted(ranks), f"{root} includes a layer after one above it: {units}"
        for r in rels:
            assert os.path.exists(os.path.join(CORE, r)), f"{root} includes missing {r}"
    on_disk = {
        os.path.relpath(os.path.join(d, f), CORE)
        for d, _, fs in os.walk(EXT)
        for f in fs
        if f.endswith((".pxi", ".pxd"))
    }
    listed = set(pyx)
    pxd = os.path.join(CORE, "_core.pxd")
    if os.path.exists(pxd):
        listed |= set(includes(pxd))
    assert on_disk == listed, f"units not included: {sorted(on_disk - listed)}"


def test_no_unit_includes_or_cimports_and_only_sys_is_foreign():
    order, files, texts = load_units()
    for rel, text in texts.items():
        if rel in (ROOT_PRE, ROOT_POST):
            continue
        code = strip_keep_includes(text)
        assert not _INCLUDE.search(code), f"{rel} includes a file: only the roots do"
        if rel.startswith(os.path.join("_ext", "sys") + os.sep):
            continue
        foreign = re.findall(r"(?m)^\s*(cdef\s+extern\b.*|.*\bcimport\b.*)$", strip(text))
        assert not foreign, f"{rel}: a foreign declaration outside the sys layer: {foreign}"


def test_no_unit_uses_a_name_declared_above_it():
    order, files, texts = load_units()
    order = rank_order(order)
    found = upward_uses(order, files, texts)
    assert not found, "upward uses (unit, name, the unit above that declares it):\n" + "\n".join(
        f"  {rel}: {n} ({v})" for rel, n, v in found
    )


def c_names(code: str) -> set[str]:
    """The C-level names among a stripped unit's declarations (what a .pxd can declare):
    those of `cdef`/`ctypedef` lines, enum members, extern blocks."""
    keep = "\n".join(
        ln
        for ln in logical_lines(code)
        if not re.match(r"^(?:class|def|async|import|from|[A-Za-z_]\w*\s*(?::[^=]*)?=)\b", ln)
    )
    return declarations(keep)


def test_what_a_unit_uses_of_another_is_in_its_pxd():
    """A unit's .pxd is its interface: a C-level name (cdef function, struct, ctypedef,
    enum member, C global, cdef class) that another unit uses is declared there, not only
    in the unit's .pxi. (Python-level names, def functions and module objects, are looked
    up at run time and need no declaration.)"""
    order, files, texts = load_units()
    if not any(rel.endswith(".pxd") for rel in texts):
        pytest.skip("no .pxd yet")
    code = {rel: strip(t) for rel, t in texts.items()}
    owner: dict[str, str] = {}
    for u in order:
        for rel in files[u]:
            for n in declarations(code[rel]):
                owner.setdefault(n, u)
    missing = []
    for v in order:
        pxd = [r for r in files[v] if r.endswith(".pxd")]
        pxi = [r for r in files[v] if r.endswith(".pxi")]
        declared = set().union(*(declarations(code[r]) for r in pxd)) if pxd else set()
        private = set().union(*(c_names(code[r]) for r in pxi)) if pxi else set()
        for u in order:
            if u == v:
                continue
            for rel in files[u]:
                for n in used_names(code[rel]):
                    if owner.get(n) == v and n in private and n not in declared:
                        missing.append(f"{rel} uses {n}, which {v}.pxd does not declare")
    assert not missing, "\n".join(sorted(set(missing)))


def test_the_kinds_read_words_a_and_b_through_named_views():
    """Words A and B of a lock body are anonymous lines (shm_body.wa, .wb); each kind
    names the parts it uses in its .pxd (ticket_next, queue_tail, fx_state, pm_mutex...),
    and its .pxi, like every unit but the raw dump of lockbase's _raw, goes through
    those names."""
    order, files, texts = load_units()
    raw = re.compile(r"(?<![\w])(?:b|self\.b|pk\.b)?(?:\.|->)w[ab]\b|\bw[ab]\.(?:u32|u64|m)\b")
    found = []
    for rel, text in texts.items():
        if rel.endswith(".pxd") or rel.startswith(("_core", os.path.join("_ext", "sys"))):
            continue
        code = strip(text)
        if rel.endswith(os.path.join("lock", "lockbase.pxi")):
            code = code.replace("self.b.wa.u64[0]), ", "").replace("self.b.wb.u64[0])", "")
        found += [f"{rel}: {m.group(0)}" for m in raw.finditer(code)]
    assert not found, "words A/B used without a named view:\n" + "\n".join(found)


def test_design_section_1_names_every_unit():
    order, _, _ = load_units()
    order = [u for u in order if u not in (ROOT_PRE, ROOT_POST)]
    with open(os.path.join(ROOT, "docs", "design.md")) as f:
        doc = f.read()
    s1 = doc[doc.index("## §1") : doc.index("## §2")]
    for u in order:
        assert u.split("/")[1] in s1, f"docs/design.md §1 does not name unit {u}"


def test_the_checker_sees_an_upward_use():
    """The rule above cannot pass vacuously: a use, in the region, of a name only a kind
    declares, and a lower unit calling the lock layer, are both reported."""
    order, files, texts = load_units()
    order = rank_order(order)
    region = next(r for r in texts if r.endswith(os.path.join("base", "region.pxi")))
    lock = next(r for r in texts if r.endswith(os.path.join("lock", "lockbase.pxi")))
    wait = next(r for r in texts if r.endswith(os.path.join("base", "wait.pxi")))
    texts = dict(texts)
    texts[region] += "\n\ncdef int _probe() except -1:\n    return TicketLock is None\n"
    texts[wait] += "\n\ncdef object _probe2():\n    return _open_standalone\n"
    found = {(rel, n) for rel, n, _ in upward_uses(order, files, texts)}
    assert (region, "TicketLock") in found
    assert (wait, "_open_standalone") in found
    assert lock not in {rel for rel, _ in found}
