import pytest

from fake import FakeDaemon


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
