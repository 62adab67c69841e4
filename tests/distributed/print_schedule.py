"""Print the wrapper program ember compiles for a graph with collectives (one rank, gloo): the overlap
pass's order and the bucketing pass's buckets, as tests/distributed/test_schedule_determinism.py compares
them across processes."""
import torch
import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx

import ember


def collectives(x, y, w):
    c10d, group = torch.ops._c10d_functional, dist.group.WORLD.group_name
    outs = []
    for i in range(4):
        h = torch.mm(x + i, w).relu()
        outs.append(c10d.wait_tensor(c10d.all_reduce(h * 2, "sum", group)))
        outs.append(c10d.wait_tensor(c10d.all_gather_into_tensor(y.sin() + i, 1, group)))
        outs.append(c10d.wait_tensor(c10d.reduce_scatter_tensor(h.cos(), "avg", 1, group)))
        outs.append(torch.mm(outs[-3], w).tanh() + outs[-2].sum())
    return outs


if __name__ == "__main__":
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    args = [torch.randn(8, 16), torch.randn(4, 4), torch.randn(16, 16)]
    # a budget that holds some collectives in flight at once but not all, and buckets of two tensors
    with ember.config.patch(overlap_memory_budget_bytes=3000, collective_bucket_bytes=1024, graph_cache=False,
                            wrapper="python"):
        compiled = ember.compile_graph(make_fx(collectives)(*args), args)
    print(compiled.source)
    dist.destroy_process_group()
