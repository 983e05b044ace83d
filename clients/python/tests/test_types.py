"""The package's types, checked by mypy: the package itself under --strict
(pyproject.toml's [tool.mypy]), and what a type checker tells a user's
program (connect's keyword arguments, the asyncio client's awaitables)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # clients/python


def mypy(*args: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, MYPYPATH=os.path.join(ROOT, "src"))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", os.devnull, "--no-error-summary", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )


def test_the_package_checks_strictly():
    # Against the oldest Python mypy can target (the package supports 3.9): nothing of the standard library
    # newer than that is used.
    r = mypy("--python-version", "3.10", "-p", "fanout_client")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_package_is_marked_typed():
    assert os.path.isfile(os.path.join(ROOT, "src", "fanout_client", "py.typed"))


# A user's program; a line ending in "# error: TEXT" must get an error containing TEXT, every other none.
USER = '''\
import asyncio
import fanout_client
from fanout_client import aio


def threads() -> None:
    with fanout_client.connect("h:1", max_in_flight=8, client_id="w", auth_token="t") as c:
        for m in c:
            key: bytes = m.key  # error: "bytes | None"
            m.ack()
        c.consume(lambda m: None, concurrency=4)
    fanout_client.connect("h:1", max_in_flight="8")  # error: Argument "max_in_flight" to "connect" has incompatible type "str"; expected "int"
    fanout_client.connect("h:1", max_inflight=8)  # error: Unexpected keyword argument "max_inflight"


async def asyncio_client() -> None:
    async with await aio.connect(["h:1", "h:2"], max_in_flight=8) as c:
        async for m in c:
            await m.ack()
            await m.nack(delay=1.5, reason="busy")
            m.touch()  # error: must be used

        async def handler(m: aio.Message) -> None:
            raise fanout_client.RetryAfter(2.0, "later")

        await c.consume(handler, concurrency=4)
        await c.consume(lambda m: None)  # error: Argument 1 to "consume"
    await aio.connect("h:1", reconnect="yes")  # error: Argument "reconnect" to "connect" has incompatible type "str"; expected "bool"
'''


def test_a_type_checker_sees_the_arguments(tmp_path):
    """Every line of USER checks but the ones marked, each for its reason."""
    (tmp_path / "user.py").write_text(USER)
    r = mypy("--strict", "--config-file", os.devnull, "user.py", cwd=str(tmp_path))
    want = {}
    for n, line in enumerate(USER.splitlines(), 1):
        if "# error: " in line:
            want[n] = line.split("# error: ", 1)[1]
    got = {}
    for line in r.stdout.splitlines():
        if line.startswith("user.py:") and ": error: " in line:
            where, _, what = line.partition(": error: ")
            got.setdefault(int(where.split(":")[1]), []).append(what)
    assert sorted(got) == sorted(want), r.stdout
    for n, text in want.items():
        assert any(text in e for e in got[n]), f"line {n}: want an error with {text!r}, got {got[n]}"
