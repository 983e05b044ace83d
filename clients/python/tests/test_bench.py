"""tests/bench_clients.py keeps working: each variant, a few hundred messages."""

import pytest

import bench_clients


@pytest.mark.parametrize("name", sorted(bench_clients.VARIANTS))
def test_bench_variant_runs(name):
    assert bench_clients.run(name, 300, 16) > 0
