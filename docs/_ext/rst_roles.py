"""A griffe extension for the API reference: convoy's docstrings use reST's roles
(``:class:`Dataset```) and ``::`` before literal blocks; the reference renders them as
Markdown code, so roles become inline code and ``::`` a colon."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`~?([^`]+)`")
LITERAL = re.compile(r"(\S)::$", re.M)


class RstRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader,
                  **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = ROLE.sub(r"`\1`", obj.docstring.value)
            obj.docstring.value = LITERAL.sub(r"\1:", value)
