"""examples/parallel_toolkit.py on 2 CPU ranks with gloo: a Llama-style model under tensor x data parallelism,
its joint graph exported, a user pass applied, forward and backward compiled with ember.compile_graph, 5 steps
trained to eager's losses and parameters with every collective inside ember's graphs (the example checks all
that and prints PASS). On 2 ranks one mesh dimension has both: a 1 x 2 mesh carries the tensor-parallel
collectives, a 2 x 1 mesh the gradient averaging of data parallelism."""
import os

import pytest
from spawn_ranks import ROOT, requires_gloo, run_script

pytestmark = requires_gloo


@pytest.mark.parametrize("mesh", ["1,2", "2,1"])
def test_parallel_toolkit_example_passes(mesh):
    done = run_script(os.path.join(ROOT, "examples", "parallel_toolkit.py"), ["--device", "cpu", "--mesh", mesh])
    for r, (code, log) in enumerate(done):
        assert code == 0 and f"rank {r}: " in log and log.rstrip().endswith("PASS"), log[-4000:]
