"""Running from the wrong folder: when the current directory holds something named
``shmlocks`` that is not the installed package, ``python -m shmlocks`` (which puts the
current directory first on sys.path) says so, instead of failing on an import inside the
package or telling the user to run the install command they just ran."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import posix_ipc
import pytest

import shmlocks

pytestmark = pytest.mark.timeout(60)

PKG = os.path.dirname(os.path.abspath(shmlocks.__file__))


def test_a_clone_named_shmlocks_in_the_current_directory(tmp_path):
    """The folder that holds a clone: `shmlocks` there is the repository (no __init__.py),
    a namespace package that an editable install's finder does not override."""
    (tmp_path / "shmlocks" / "shmlocks").mkdir(parents=True)
    (tmp_path / "shmlocks" / "README.md").write_text("# shmlocks\n")
    r = subprocess.run(
        [sys.executable, "-m", "shmlocks", "ls"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "cannot import name" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode != 0:  # (with a regular, non-editable install the package wins)
        assert r.stderr.startswith("shmlocks: error: 'shmlocks' here is the folder "), r.stderr
        assert str(tmp_path / "shmlocks") in r.stderr and "shadows" in r.stderr


def test_an_uncompiled_source_tree_shadowing_an_installed_package(tmp_path):
    """The repository root after `pip install .`: its shmlocks/ has no compiled core, and
    the installed package (here: a site folder on PYTHONPATH, without the editable finder:
    -S) is shadowed by it. The error says so and names both, rather than "install it"."""
    src = tmp_path / "repo" / "shmlocks"
    src.mkdir(parents=True)
    for f in os.listdir(PKG):
        if f.endswith(".py"):
            shutil.copy(os.path.join(PKG, f), src)
    site = tmp_path / "site"
    site.mkdir()
    os.symlink(PKG, site / "shmlocks")
    path = os.pathsep.join([str(site), os.path.dirname(posix_ipc.__file__)])  # its dependency
    r = subprocess.run(
        [sys.executable, "-S", "-m", "shmlocks", "ls"],
        cwd=src.parent,
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "shadows the shmlocks installed in" in last, r.stderr
    assert str(site / "shmlocks") in last and str(src) in last, last
    # and without the shadow, from another directory, the installed one is used
    ok = subprocess.run(
        [sys.executable, "-S", "-c", "import shmlocks; print(shmlocks.__file__)"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=path),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ok.stdout.strip() == str(site / "shmlocks" / "__init__.py"), ok.stderr


def test_a_source_tree_given_another_trees_compiled_core(tmp_path):
    """An editable install's finder maps ``shmlocks._core`` to its own tree, whatever tree
    ``shmlocks`` itself came from: from the root of another clone, its package gets that
    core, whose imports may not match. The error says so rather than only "cannot import
    name". (The finder here is a stand-in for setuptools' editable finder.)"""
    src = tmp_path / "other-clone" / "shmlocks"
    src.mkdir(parents=True)
    for f in os.listdir(PKG):
        if f.endswith(".py"):
            shutil.copy(os.path.join(PKG, f), src)
    other = tmp_path / "editable-tree" / "shmlocks"  # its core needs a newer errors.py
    other.mkdir(parents=True)
    (other / "_core.py").write_text(
        "raise ImportError(\"cannot import name 'NewError' from 'shmlocks.errors'\")\n"
    )
    code = (
        "import importlib.machinery as m, sys\n"
        "class Editable:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        if name == 'shmlocks._core':\n"
        f"            return m.PathFinder.find_spec(name, [{str(other)!r}])\n"
        "sys.meta_path.insert(0, Editable)\n"
        "import shmlocks\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=src.parent, capture_output=True, text=True, timeout=30
    )
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "cannot import name" in last and "belongs to another shmlocks tree" in last, last
    assert str(src) in last and str(other / "_core.py") in last, last
