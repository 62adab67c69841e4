import os

import pytest
import torch

import ember  # noqa: F401  (sets TRITON_INTERPRET=1 on machines without a GPU, before triton loads)
from ember.testing import check, fresh_compile  # noqa: F401


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    ember.metrics.reset()
    torch.manual_seed(0)
    with ember.config.patch(fallback_on_error=False):
        yield


@pytest.fixture
def device():
    return os.environ.get("EMBER_TEST_DEVICE", "cpu")
