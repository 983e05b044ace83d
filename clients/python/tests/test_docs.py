"""The Python blocks of the docs that show this client (not run: they need a
daemon and the reader's own process()): each compiles, and every name of
the package they use exists."""

from __future__ import annotations

import os
import re

import pytest

import fanout_client
from fanout_client import aio

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DOCS = ["clients/python/README.md", "README.md", "docs/clients.md"]


def blocks(path):
    with open(os.path.join(REPO, path)) as f:
        text = f.read()
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


@pytest.mark.parametrize("path", DOCS)
def test_python_blocks_compile_and_name_what_exists(path):
    found = blocks(path)
    assert found, f"{path} has no python block"
    for line, code in found:
        compile(code, f"{path}:{line}", "exec")
        for mod, name in re.findall(r"\b(fanout_client|aio)\.(\w+)", code):
            assert hasattr(fanout_client if mod == "fanout_client" else aio, name), f"{path}:{line}: {mod}.{name}"
