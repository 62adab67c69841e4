"""runtime/static_launch.py: what torch's C launcher is given for a compiled Triton kernel (the function's
parameters: no constexprs or specialised constants, pointers as integers, a null per declared scratch
area), checked with stand-ins on any machine; on a GPU, real kernels launched through it against eager."""
import os
import types

import pytest
import torch

from ember.runtime import static_launch as sl


def fake_kernel(signature, constants=(), arg_names=None, **metadata):
    names = arg_names or list(signature)
    src = types.SimpleNamespace(fn=types.SimpleNamespace(arg_names=names), signature=signature,
                                constants={(names.index(n),): v for n, v in dict(constants).items()})
    meta = dict(num_warps=4, shared=96, num_ctas=1, global_scratch_size=0, profile_scratch_size=0)
    meta.update(metadata)
    return types.SimpleNamespace(src=src, function=0xF00, metadata=types.SimpleNamespace(**meta))


SIGNATURE = {"in_ptr0": "*bf16", "out_ptr0": "*fp32", "xnumel": "i32", "ks0": "i64", "XBLOCK": "constexpr"}


def test_the_parameters_are_the_arguments_less_constexprs_and_specialised_constants():
    k = fake_kernel(dict(SIGNATURE, xnumel="constexpr"), constants={"xnumel": 1, "XBLOCK": 128})
    assert sl.parameter_layout(k.src, 4) == ([0, 1, 3], "OOl")
    assert sl.parameter_layout(k.src, 5) == ([0, 1, 3], "OOl")       # the constexpr passed positionally too
    assert sl.parameter_layout(fake_kernel(dict(SIGNATURE, ks0="fp64")).src, 4) == ([0, 1, 2, 3], "OOid")
    assert sl.parameter_layout(fake_kernel(dict(SIGNATURE, ks0="nvTmaDesc")).src, 4) is None


def test_the_c_launcher_gets_integer_pointers_and_a_null_per_scratch_area(monkeypatch):
    calls = []
    monkeypatch.setattr(sl, "c_launcher", lambda: lambda *a: calls.append(a))
    go = sl.static_launch(fake_kernel(SIGNATURE), 4, 2)
    x, y = torch.randn(8).bfloat16(), torch.empty(8)
    go((3, 2), 77, (x.data_ptr(), y.data_ptr(), 8, 5))
    assert calls == [(0xF00, 3, 2, 1, 4, 96, "OOilOO", (x.data_ptr(), y.data_ptr(), 8, 5, None, None), 77)]
    # a Triton that declares no scratch areas gives the function no scratch parameters
    old = fake_kernel(SIGNATURE)
    del old.metadata.global_scratch_size, old.metadata.profile_scratch_size
    sl.static_launch(old, 4, 1)((1,), 0, (x.data_ptr(), y.data_ptr(), 8, 5))
    assert calls[-1][1:4] == (1, 1, 1) and calls[-1][6:8] == ("OOil", (x.data_ptr(), y.data_ptr(), 8, 5))


@pytest.mark.parametrize("metadata", [dict(num_ctas=2), dict(global_scratch_size=64), dict(profile_scratch_size=8),
                                      dict(launch_cooperative_grid=True), dict(launch_pdl=True),
                                      dict(tensordesc_meta=[{}])])
def test_launches_the_c_launcher_cannot_make_stay_with_triton(monkeypatch, metadata):
    monkeypatch.setattr(sl, "c_launcher", lambda: print)
    assert sl.static_launch(fake_kernel(SIGNATURE), 4, 1) is not None
    assert sl.static_launch(fake_kernel(SIGNATURE, **metadata), 4, 1) is None


on_gpu = pytest.mark.skipif(os.environ.get("EMBER_TEST_DEVICE") != "cuda" or sl.c_launcher() is None,
                            reason="torch's C launcher needs a CUDA build and a GPU")


@on_gpu
def test_compiled_graphs_launch_through_the_c_launcher_and_match_eager(monkeypatch):
    """A graph with a misaligned input, a row reduction and a full sum (a kernel over one element: Triton
    specialises its xnumel into a constant), called twice (the second call takes the C launcher)."""
    import ember
    from ember.runtime import launch
    used = []
    real = sl.static_launch
    monkeypatch.setattr(launch, "static_launch", lambda k, n, r: used.append(real(k, n, r)) or used[-1])

    def f(x, w, b):
        return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w, b).relu() * 2 + x[:, :1], x.float().sum()

    base = torch.randn(4097 * 96 + 1, device="cuda", dtype=torch.bfloat16)
    x = base[1:].view(4097, 96)                                   # 2-byte offset: not 16-byte aligned
    w, b = torch.randn(96, device="cuda"), torch.randn(96, device="cuda")
    g = torch.compile(f, backend="ember", dynamic=False)
    for _ in range(2):
        torch.testing.assert_close(g(x, w, b), f(x, w, b), atol=2e-2, rtol=2e-3)
    assert used and all(u is not None for u in used)
    assert ember.metrics.generated_kernel_count >= 2
