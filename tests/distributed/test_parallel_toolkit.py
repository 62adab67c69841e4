"""examples/parallel_toolkit.py on 2 CPU ranks with gloo: a tensor-parallel Llama-style model's joint graph
exported, a user pass applied, forward and backward compiled with ember.compile_graph, 5 steps trained to
eager's losses with every collective inside ember's graphs (the example checks all that and prints PASS)."""
import os

from spawn_ranks import ROOT, requires_gloo, run_script

pytestmark = requires_gloo


def test_parallel_toolkit_example_passes():
    done = run_script(os.path.join(ROOT, "examples", "parallel_toolkit.py"), ["--device", "cpu"])
    for r, (code, log) in enumerate(done):
        assert code == 0 and f"rank {r}: " in log and log.rstrip().endswith("PASS"), log[-4000:]
