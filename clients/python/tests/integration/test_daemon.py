"""The client against the real daemon. Each test is run by a Go test in
integration/python_test.go, which starts the daemons, produces the messages
"m-<i>" and checks the committed offsets; the addresses come in
FANOUT_TEST_DAEMONS. Without them the tests fail, never skip."""

from __future__ import annotations

import os
import time

import pytest

import fanout_client

pytestmark = pytest.mark.integration

TIMEOUT = 60.0


def env(name: str) -> str:
    v = os.environ.get(name, "")
    if not v:
        pytest.fail(f"{name} is not set: run this test through integration/python_test.go (bin/integration)")
    return v


def daemons():
    return env("FANOUT_TEST_DAEMONS").split(",")


def consume_all(client, n, on_message=None):
    """Acks messages until n distinct values were acked; returns {value: message}."""
    acked = {}
    deadline = time.monotonic() + TIMEOUT
    while len(acked) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"acked {len(acked)} of {n} messages in {TIMEOUT}s: {sorted(acked)}"
        m = client.get(left)
        if m is None:
            continue
        if on_message is not None and on_message(m):
            continue
        assert m.ack() is True
        acked[m.value.decode()] = m
    return acked


def test_consume_ack_nack_touch():
    n = int(env("FANOUT_TEST_COUNT"))
    with pytest.raises(fanout_client.ConnectError) as e:
        fanout_client.connect(daemons(), auth_token="wrong", timeout=TIMEOUT)
    assert isinstance(e.value.__cause__, fanout_client.RemoteError)
    assert e.value.__cause__.code_name == "ERROR_CODE_UNAUTHORIZED"

    nacked = {}

    def nack_first(m):
        if not nacked:
            m.touch()
            assert m.nack(reason="python test") is True
            nacked[m.value] = m
            return True
        return False

    with fanout_client.connect(daemons(), auth_token=env("FANOUT_TEST_TOKEN"), client_id="py-it",
                               max_in_flight=8, timeout=TIMEOUT) as client:
        acked = consume_all(client, n, nack_first)
    assert sorted(acked) == sorted(f"m-{i}" for i in range(n))
    (value, first), = nacked.items()
    again = acked[value.decode()]
    assert again.attempt == first.attempt + 1
    assert (again.partition, again.offset) == (first.partition, first.offset)
    assert again.delivery_id != first.delivery_id
    for m in acked.values():
        assert m.member in daemons()
        assert m.value == f"m-{int(m.key)}".encode()


def test_redirected_to_the_leader():
    n = int(env("FANOUT_TEST_COUNT"))
    leader = env("FANOUT_TEST_LEADER")
    with fanout_client.connect(daemons(), timeout=TIMEOUT) as client:
        acked = consume_all(client, n)
        assert client.members == []  # leader mode
    assert sorted(acked) == sorted(f"m-{i}" for i in range(n))
    assert {m.member for m in acked.values()} == {leader}


def test_spread_one_session_per_member():
    n = int(env("FANOUT_TEST_COUNT"))
    members = sorted(env("FANOUT_TEST_MEMBERS").split(","))
    with fanout_client.connect(daemons(), max_in_flight=8, timeout=TIMEOUT) as client:
        acked = consume_all(client, n)
        assert client.members == members
    assert sorted(acked) == sorted(f"m-{i}" for i in range(n))
    assert {m.member for m in acked.values()} == set(members)
