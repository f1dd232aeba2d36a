"""A griffe extension for the docs build: hpctrain's docstrings are prose with a little reST.

Rewrites, before mkdocstrings renders them as Markdown: ``:class:`X``` (and ``:func:``, ``:meth:``,
``:mod:``, ``:attr:``, ``:exc:``…) into a code span ```X```, and a paragraph ending in ``::`` into
one ending in ``:`` (the indented block after it is a Markdown code block already). Only the
rendered text changes; the source is untouched.
"""
from __future__ import annotations

import re

from griffe import Extension, Object

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|const):`~?\.?([^`]+)`")
LITERAL = re.compile(r"(\S)::[ \t]*$", re.M)


def rst_to_markdown(text: str) -> str:
    text = ROLE.sub(lambda m: f"``{m.group(1)}``", text)
    return LITERAL.sub(r"\1:", text)


class RstToMarkdown(Extension):
    def on_object(self, *, obj: Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
