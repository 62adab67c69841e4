import pytest

import ember


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The graph cache on, in a cache directory of the test's own (yields its root)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(root))
    with ember.config.patch(graph_cache=True):
        yield root
