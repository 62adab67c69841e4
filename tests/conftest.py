import faulthandler
import os
import tempfile

import pytest
import torch

import ember  # noqa: F401  (sets TRITON_INTERPRET=1 on machines without a GPU, before triton loads)
from ember.testing import check, fresh_compile  # noqa: F401


# A graph cache hit skips the pipeline a test is about, monkeypatches included: the suite, and the processes
# its tests start, compile every graph unless EMBER_GRAPH_CACHE=1 is set (a stress test of the cache: run
# the suite twice; tests that inspect or patch the pipeline then fail). The graph cache's own tests turn it
# on with a cache directory of their own.
GRAPH_CACHE = bool(os.environ.get("EMBER_GRAPH_CACHE")) and ember.config.graph_cache
os.environ.setdefault("EMBER_GRAPH_CACHE", "0")


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    ember.metrics.reset()
    torch.manual_seed(0)
    with ember.config.patch(fallback_on_error=False, graph_cache=GRAPH_CACHE):
        yield


@pytest.fixture
def device():
    return os.environ.get("EMBER_TEST_DEVICE", "cpu")


@pytest.fixture
def exact_float32_convolutions():
    """cuDNN runs float32 convolutions in TF32 by default, rounded differently per algorithm and layout (and
    ember's 1x1 convolutions then multiply in TF32 too): off, eager's and ember's agree to float32's tolerance."""
    c = torch.backends.cudnn
    with c.flags(enabled=c.enabled, benchmark=c.benchmark, deterministic=c.deterministic, allow_tf32=False):
        yield


# A test that hangs (seen on a GPU: the suite stalled at 98%) writes every thread's stack to
# $EMBER_TEST_HANG_DIR/hang_<pid>.log and ends its process after EMBER_TEST_HANG_S seconds, so the log names
# where it hangs and xdist goes on with a new worker (pytest captures stderr, so a file).
HANG_S = float(os.environ.get("EMBER_TEST_HANG_S", "0") or 0)


@pytest.fixture(autouse=True)
def _hang_watchdog(request):
    if HANG_S <= 0:
        yield
        return
    folder = os.environ.get("EMBER_TEST_HANG_DIR") or tempfile.gettempdir()
    log = open(os.path.join(folder, f"hang_{os.getpid()}.log"), "w")
    log.write(f"{request.node.nodeid} ran past {HANG_S:.0f} s\n")
    log.flush()
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=log)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        log.close()
        os.remove(log.name)
