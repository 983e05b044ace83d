import pytest

from fanout_client import _state
from fake import FakeDaemon
from flavors import Flavor


@pytest.fixture
def daemon():
    d = FakeDaemon()
    yield d
    d.close()


@pytest.fixture
def daemon2():
    d = FakeDaemon()
    yield d
    d.close()


@pytest.fixture(params=["threads", "asyncio"])
def flavor(request):
    """Each test taking it runs with the threaded client and with the asyncio client (tests/flavors.py)."""
    f = Flavor(request.param)
    yield f
    f.close()


@pytest.fixture(autouse=True)
def short_linger(monkeypatch):
    """A client that said goodbye waits this long for the daemon to close; the fake daemon seldom does."""
    monkeypatch.setattr(_state, "LINGER_TIMEOUT", 0.25)
