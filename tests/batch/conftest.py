"""Fixtures of the batch tests: one real local Ray cluster for the Ray workers' tests."""
import os

import pytest

# Ray reads its auth mode when it is imported; the tests' clusters have token authentication
# off, as `ray start` clusters of Ray 2.60 do (tests/raycluster.py).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def ray_cluster():
    """A head node and a second node, two CPUs each, as separate `ray start` processes
    (tests/raycluster.py), shared by the Ray workers tests of the session."""
    pytest.importorskip("ray")
    from raycluster import module_cluster

    yield from module_cluster(nodes=2, cpus=2)


@pytest.fixture
def ray_address(ray_cluster, monkeypatch):
    """RAY_ADDRESS pointing at ``ray_cluster`` for this test and the drivers it starts
    (Ray's own convention: Workers(kind="ray") without ray_address connects there)."""
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    return ray_cluster.address
