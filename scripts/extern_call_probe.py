"""Host time of one ATen call made the ways a wrapper can make it (needs a CUDA GPU):
    python scripts/extern_call_probe.py
For mm, addmm and bmm on small bf16 operands (the GPU work stays below the host's, so the time per call
is the host's): the public function (`torch.mm`), the same with `out=`, the OpOverload
(`aten.mm.default`), its C entry (`aten.mm.default._op`, what ember's Python wrapper calls), and the
layout checks made after an extern (ember's `conform_layout`, torch's C `assert_size_stride`)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ember.runtime.checks import conform_layout  # noqa: E402
from launch_probe import us  # noqa: E402

aten = torch.ops.aten


def main():
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    a, b, bias, x, y = mk(64, 64), mk(64, 64), mk(64), mk(4, 64, 64), mk(4, 64, 64)
    o2, o3 = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16), mk(4, 64, 64)
    cases = {
        "mm": (torch.mm, aten.mm.default, (a, b), o2),
        "addmm": (torch.addmm, aten.addmm.default, (bias, a, b), o2),
        "bmm": (torch.bmm, aten.bmm.default, (x, y), o3),
    }
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            for name, (public, overload, args, out) in cases.items():
                res = {
                    "torch": us(lambda: public(*args)),
                    "torch out=": us(lambda: public(*args, out=out)),
                    "OpOverload": us(lambda: overload(*args)),
                    "OpOverload._op": us(lambda: overload._op(*args)),
                }
                print(f"grad {grad!s:5} {name:6} " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()), flush=True)
    t = a @ b
    res = {"conform_layout": us(lambda: conform_layout(t, (64, 64), (64, 1), "t"))}
    check = getattr(torch._C._dynamo.guards, "assert_size_stride", None)
    if check is not None:
        res["assert_size_stride"] = us(lambda: check(t, (64, 64), (64, 1)))
    print("checks: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()))


if __name__ == "__main__":
    main()
