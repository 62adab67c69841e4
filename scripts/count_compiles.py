"""How many Triton compiles a model's training step asks for on a GPU, counted on a machine without one.

    EMBER_CPU_BACKEND=triton TRITON_INTERPRET=1 python -m scripts.count_compiles resnet50 [--batch 16]

The step (forward, loss, backward, bf16 autocast as in benchmarks/models.py) is traced with fake tensors
and each graph goes through ember's whole pipeline for the Triton backend with autotuning and the compile
pool's bookkeeping switched on, so the counts are the GPU's: kernels generated, kernels defined (one per
distinct source within a graph), and compile jobs (each defined kernel's launch configs: its autotuning
candidates). Nothing runs. Sizes are the GPU benchmark's (images 224 x 224, text batch 4 x 512).
Models: resnet50, vit and convnext (timm), bert, gpt2 and llama (transformers), and mlp (no package needed).
"""
import argparse
import collections
import functools
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_function
from torch._subclasses.fake_tensor import FakeTensorMode

import ember
from ember.codegen.triton.backend import TritonBackend
from ember.device import backend_for
from benchmarks import models
from ember.graph.passes.partition import partition
from ember.graph.decompose import decomposition_table

counts = collections.Counter()
candidates = collections.Counter()      # launch configs per generated kernel -> how many kernels


def _count_as_on_a_gpu() -> None:
    """The interpreter backend neither tunes nor records launches for the compile pool; count as the GPU
    backend would."""
    warm, load = TritonBackend._warm, TritonBackend.load
    TritonBackend.tunes = property(lambda self: ember.config.autotune)
    TritonBackend.precompiles = property(lambda self: True)

    def warm_counted(self, graph, args, configs):
        counts["generated"] += 1
        candidates[len(configs)] += 1
        return warm(self, graph, args, configs)

    def load_counted(self, kernels):
        counts["defined"] += len(kernels)
        counts["compile jobs"] += sum(len(k.warm.configs) for k in kernels if k.warm is not None)
        return load(self, kernels)
    TritonBackend._warm, TritonBackend.load = warm_counted, load_counted


def _compiler(gm, example_inputs, **kw):
    t0 = time.perf_counter()
    ember.compile_graph(gm, example_inputs, **kw)
    counts["ember seconds"] += time.perf_counter() - t0
    return gm            # the fake step runs the traced graph itself


def stub_torchvision() -> None:
    """timm imports torchvision, which has no CPU wheel on the dev box: stand in a package whose every
    attribute is an empty nn.Module class (the models counted here use none of them) whose own attributes
    are their names."""
    import importlib.abc
    import importlib.machinery
    import types

    class AnyAttribute(type):          # InterpolationMode.NEAREST and the like: a name is enough
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return name

    class Stub(types.ModuleType):
        __path__: list = []

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return AnyAttribute(name, (torch.nn.Module,), {})

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            return Stub(spec.name)

        def exec_module(self, module):
            module.__version__ = "0.0"
    sys.meta_path.insert(0, Finder())


def _model(name: str):
    try:
        import torchvision  # noqa: F401
    except ImportError:
        stub_torchvision()
    if name == "resnet50":      # timm's, which needs no real torchvision
        import timm
        return timm.create_model("resnet50", pretrained=False), 1000
    return models.build(name, small=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=models.MODELS + ["mlp"])
    ap.add_argument("--batch", type=int, default=None, help="default: the training benchmark's (16 images, 4 x 512 tokens)")
    a = ap.parse_args(argv)
    if not isinstance(backend_for("cpu"), TritonBackend) or os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("run with EMBER_CPU_BACKEND=triton TRITON_INTERPRET=1 (the Triton backend, on fake CPU tensors)")
    _count_as_on_a_gpu()
    ember.config.wrapper = "python"     # definitions are counted where the Python wrapper loads its kernels
    ember.config.graph_cache = False    # counted as the pipeline generates them (a cache hit generates none)
    model, n_out = _model(a.model)
    example = models.make_inputs(a.model, "train", False, n_out, "cpu")      # only their sizes are used
    image = "x" in example
    with FakeTensorMode():
        state = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype).requires_grad_(v.requires_grad)
                 for k, v in list(model.named_parameters()) + list(model.named_buffers())}
        names = list(state)
        data = [torch.empty((a.batch or v.shape[0],) + v.shape[1:], dtype=v.dtype) for v in example.values()]

        def step(*args):
            tensors = dict(zip(names, args[:len(names)]))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                if image:
                    out = torch.func.functional_call(model, tensors, (args[-2],))
                    return F.cross_entropy(out.float(), args[-1])
                return torch.func.functional_call(model, tensors, (), dict(input_ids=args[-1], labels=args[-1],
                                                                          return_dict=False))[0]
        compiled = aot_function(step, fw_compiler=functools.partial(_compiler, is_backward=False),
                                bw_compiler=functools.partial(_compiler, is_backward=True),
                                partition_fn=partition, decompositions=decomposition_table())
        compiled(*state.values(), *data).backward()
    print(f"{a.model}: kernels generated {counts['generated']}, defined {counts['defined']}, Triton compile jobs "
          f"{counts['compile jobs']}; ember's own compile {counts['ember seconds']:.1f} s")
    print("launch configs per generated kernel -> kernels:", dict(sorted(candidates.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
