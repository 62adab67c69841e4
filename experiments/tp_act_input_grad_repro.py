"""A torch bug, not ember's: a tensor-parallel embedding's output, given to a compiled function, loses its
gradient. RowwiseParallel's output hook returns `DTensor.to_local()` of an all-reduced DTensor: an
AsyncCollectiveTensor that requires grad. AOTAutograd unwraps such an input to its grad-less inner tensor, so
the compiled function's output does not require grad (pytorch/pytorch#179849 introduced the unwrap, #191113
restores requires_grad). AOTAutograd backends show it (aot_eager and ember were tried); Dynamo alone
(backend "eager") does not. In a model whose blocks are compiled, the embedding silently gets no gradient.
A copy (`h.clone()`) before the compiled function is a plain tensor, and the gradient flows.

    torchrun --nproc-per-node 2 experiments/tp_act_input_grad_repro.py [--backend aot_eager] [--clone]

Prints the embedding's gradient, eager and compiled; on an affected torch the compiled run raises "element 0
of tensors does not require grad" (without --clone).
"""
import argparse
import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--clone", action="store_true", help="copy the embedding's output first (the workaround)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    def f(x):
        return torch.relu(x).sum()

    torch.manual_seed(0)
    base = nn.Embedding(16, 8)
    tokens = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(1))
    grads = {}
    for name, fn in (("eager", f), (args.backend, torch.compile(f, backend=args.backend))):
        emb = parallelize_module(copy.deepcopy(base), mesh,
                                 RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
        x = emb(tokens)
        if dist.get_rank() == 0:
            print(f"{name}: input {type(x).__name__}, requires_grad={x.requires_grad}")
        fn(x.clone() if args.clone else x).backward()
        grads[name] = emb.weight.grad.full_tensor()
    if dist.get_rank() == 0:
        diff = (grads["eager"] - grads[args.backend]).abs().max().item()
        print(f"embedding gradient: max |eager - {args.backend}| = {diff}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
