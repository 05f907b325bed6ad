"""The compiled part of convoy: the wire-format reader of convoy.io's parsers (C++17).

Everything else (metadata, dependencies, package data) is in pyproject.toml.
"""

import os

import numpy
from setuptools import Extension, setup

# make fuzz builds with CONVOY_SANITIZE=1: AddressSanitizer and UndefinedBehaviorSanitizer.
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover"]
sanitize = os.environ.get("CONVOY_SANITIZE") == "1"

setup(
    ext_modules=[
        Extension(
            "convoy.io._native",
            sources=["src/convoy/io/_native.cpp"],
            include_dirs=[numpy.get_include()],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2" if sanitize else "-O3", "-pthread",
                                *(SANITIZE if sanitize else [])],
            extra_link_args=["-pthread", *(SANITIZE if sanitize else [])],
        )
    ]
)
