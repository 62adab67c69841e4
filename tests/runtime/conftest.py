import pytest

import ember


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The graph cache on, in a cache directory of the test's own (yields its root)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(root))
    with ember.config.patch(graph_cache=True):
        yield root


@pytest.fixture(autouse=True)
def _own_cudagraph_pools(monkeypatch):
    """Each test's CUDA graphs in pools of its own: outputs an earlier test left alive in a shared pool
    (held by a frame or a cycle not yet collected) would make its first captures run uncaptured, and the
    counts a test asserts would depend on which tests ran before it in the same worker. Likewise the
    addresses of recorded outputs: an earlier test's recording not yet collected, at an address the CPU's
    allocator hands this test's tensor, would make that tensor look like a recording's output."""
    import collections
    from ember.runtime import cudagraph_memory, cudagraphs
    monkeypatch.setattr(cudagraph_memory, "pools", collections.defaultdict(cudagraph_memory.DevicePools))
    monkeypatch.setattr(cudagraphs, "_recorded_storages", collections.Counter())
