"""An out-of-tree backend on top of ember's FX wrapper: ember fuses and generates the kernels, your code
gets the host program as a torch.fx.GraphModule and decides how to run it.

    python docs/fx_backend_example.py

With `ember.config.wrapper = "fx"`, compile_graph renders its Wrapper IR (allocations, kernel launches,
ATen fallbacks, views) as a GraphModule and hands it to `FxWrapper.compile_graph(gm)`; whatever callable
that returns is what runs. `ember.config.fx_wrapper_class` picks the subclass. The graph's nodes:

    placeholder                     the graph inputs, in order
    call_method size/stride/...     size symbols read from the inputs
    torch.empty_strided             a buffer allocation
    get_attr kernelN                a generated kernel (source in node.meta["ember_kernel_source"])
    launch_kernel(kernel, grid, *args, **meta)
                                    a kernel launch (in place, returns None; kept by eliminate_dead_code)
    torch.ops.aten.*                an ATen fallback; operator.getitem picks one of its outputs
    torch.as_strided                a view
    check_layout(t, size, stride)   a run-time layout check (config.check_extern_layouts)
    output                          the returned tuple

This example counts the nodes of each graph and routes every kernel launch through a timer.
"""
from __future__ import annotations

import collections
import time

import torch
from torch.fx.node import has_side_effect

import ember
from ember.codegen.wrapper.fx import FxWrapper, launch_kernel

# kernel name -> (launch count, seconds on the host; add a device sync to time GPU work)
KERNEL_TIMES: dict = collections.defaultdict(lambda: [0, 0.0])


@has_side_effect          # like launch_kernel: nothing uses its result, DCE must keep it
def timed_launch(name, kernel, grid, *args, **meta):
    t0 = time.perf_counter()
    launch_kernel(kernel, grid, *args, **meta)
    entry = KERNEL_TIMES[name]
    entry[0] += 1
    entry[1] += time.perf_counter() - t0


class ProfilingFxWrapper(FxWrapper):
    """Counts each graph's nodes by kind and times every kernel launch."""
    graphs: list = []     # one Counter per compiled graph

    def compile_graph(self, gm: torch.fx.GraphModule):
        counts = collections.Counter()
        for node in gm.graph.nodes:
            if node.op != "call_function":
                counts[node.op] += 1
            elif node.target is launch_kernel:
                counts["launches"] += 1
                # the kernel's name is in the node's meta; pass it first so the timer can key on it
                node.target = timed_launch
                node.args = (node.meta["ember_kernel"],) + tuple(node.args)
                counts["timed_launches"] += 1
            elif isinstance(node.target, torch._ops.OpOverload):
                counts["aten"] += 1
            else:
                counts[getattr(node.target, "__name__", str(node.target))] += 1
        gm.graph.lint()
        gm.recompile()
        ProfilingFxWrapper.graphs.append(counts)
        return gm          # any callable taking the graph's inputs works, e.g. torch.fx.Interpreter(gm).run


def run_example(device: str = "cpu") -> dict:
    def attention_scores(q, k, w):
        s = torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1)
        return torch.nn.functional.layer_norm(s, (s.shape[-1],), w).relu()

    q, k, w = torch.randn(2, 16, 8, device=device), torch.randn(2, 16, 8, device=device), torch.randn(16, device=device)
    ProfilingFxWrapper.graphs = []
    KERNEL_TIMES.clear()
    torch._dynamo.reset()
    with ember.config.patch(wrapper="fx", fx_wrapper_class=ProfilingFxWrapper):
        out = torch.compile(attention_scores, backend="ember")(q, k, w)
    stats = collections.Counter()
    for counts in ProfilingFxWrapper.graphs:
        stats.update(counts)
    stats = dict(stats)
    stats["max_abs_error"] = (out - attention_scores(q, k, w)).abs().max().item()
    stats["kernel_times"] = {name: tuple(v) for name, v in KERNEL_TIMES.items()}
    return stats


if __name__ == "__main__":
    for key, value in run_example().items():
        print(f"{key}: {value}")
