"""The compiled parts of convoy (C++17): the wire-format reader of convoy.io's parsers, the row
index of dynamic embedding tables, and the parameter servers' sparse row reads and updates.

Everything else (metadata, dependencies, package data) is in pyproject.toml.
"""

import os

import numpy
from setuptools import Extension, setup

# make fuzz builds with CONVOY_SANITIZE=1: AddressSanitizer and UndefinedBehaviorSanitizer.
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover"]
sanitize = os.environ.get("CONVOY_SANITIZE") == "1"


def _extension(name: str, source: str) -> Extension:
    return Extension(
        name,
        sources=[source],
        include_dirs=[numpy.get_include()],
        language="c++",
        extra_compile_args=["-std=c++17", "-O2" if sanitize else "-O3", "-pthread",
                            *(SANITIZE if sanitize else [])],
        extra_link_args=["-pthread", *(SANITIZE if sanitize else [])],
    )


setup(
    ext_modules=[
        _extension("convoy.io._native", "src/convoy/io/_native.cpp"),
        _extension("convoy.distribute._row_index", "src/convoy/distribute/_row_index.cpp"),
        _extension("convoy.distribute._sparse_rows",
                   "src/convoy/distribute/_sparse_rows.cpp"),
    ]
)
