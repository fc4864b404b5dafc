"""Build the compiled core. Metadata lives in pyproject.toml; this file only lists the extension."""

import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

if not sys.platform.startswith("linux"):
    raise SystemExit("shmlocks needs Linux: it is built on futex(2) and glibc robust mutexes")

DEBUG = "SHMLOCKS_DEBUG" in __import__("os").environ

ext = Extension(
    "shmlocks._core",
    sources=["shmlocks/_core.pyx"],
    include_dirs=["shmlocks/_ext/sys"],
    extra_compile_args=["-O2", "-std=gnu11", "-Wno-unused-function"]
    + (["-DSHMLOCKS_DEBUG=1", "-g"] if DEBUG else []),
    libraries=["pthread"],
)

setup(
    ext_modules=cythonize(
        [ext],
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "embedsignature": True,
            "embedsignature.format": "clinic",  # text signatures: inspect.signature works
            "binding": False,
        },
    )
)
