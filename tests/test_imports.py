"""The package's modules import each other without a circle, and the command line imports a
command's module only when that command runs (shmlocks/cli/__init__.py's table)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "shmlocks")


def _modules() -> dict[str, str]:
    """{dotted name: path} of every module of the package."""
    out = {}
    for d, _dirs, files in os.walk(PKG):
        for f in files:
            if f.endswith((".py", ".pyx")):  # _core.pyx: a module too (its imports: none here)
                rel = os.path.relpath(os.path.join(d, f), ROOT).rsplit(".", 1)[0].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(d, f)
    return out


def _edges(mods: dict[str, str]) -> dict[str, set[str]]:
    """Each module's imports of the package's own modules: every import statement, at the
    top or inside a function (a deferred import circle is a circle all the same)."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        if path.endswith(".pyx"):
            graph[name] = set()
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:  # `from pkg import mod` imports pkg.mod
                    sub = f"{node.module}.{a.name}"
                    found.add(sub if sub in mods else node.module)
        graph[name] = {m for m in found if m in mods and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state, stack = [], dict.fromkeys(graph, 0), []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state[m] == 1:
                cycles.append([*stack[stack.index(m) :], m])
            elif state[m] == 0:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if state[n] == 0:
            visit(n)
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_the_package_modules():
    mods = _modules()
    assert "shmlocks.cli" in mods and "shmlocks.waitgraph" in mods
    assert _cycles(_edges(mods)) == []


def _imported_after(code: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()[-1:] and proc.stdout.splitlines()[-1].split()


@pytest.mark.timeout(120)
def test_the_cli_imports_a_command_module_only_to_run_it():
    from shmlocks.cli import COMMANDS

    modules = {c.module for c in COMMANDS.values()}
    assert len(modules) == len(COMMANDS) >= 11
    loaded = set(_imported_after("import shmlocks.cli"))
    assert not loaded & modules, sorted(loaded & modules)
    code = "import contextlib, io, shmlocks.cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
    code += "    assert shmlocks.cli.main(['ls', '--json']) == 0"
    loaded = set(_imported_after(code))
    assert loaded & modules == {"shmlocks.cli.ls"}
