import pytest

import ember


@pytest.fixture(autouse=True)
def _cpp(device):
    """These tests are about the C++ backend: they run on CPU tensors, with it selected."""
    if device != "cpu":
        pytest.skip("the C++ backend runs CPU tensors")
    with ember.config.patch(cpu_backend="cpp"):
        yield
