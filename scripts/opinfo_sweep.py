#!/usr/bin/env python
"""OpInfo sweep: run PyTorch's OpInfo database (`op_db`) through ember and compare with eager.

For each op x dtype that the op supports on CPU, a few sample inputs are compiled with
`torch.compile(fn, backend="ember")` (Dynamo reset per sample, ember.config.fallback_on_error=False)
and compared with eager: the outputs and every input after the call (an in-place update such as batch
norm's running statistics); an op's in-place variant (index_put_) runs on the same samples. float16/bfloat16 values may differ from eager's by one rounding of the dtype;
a larger difference passes only if ember is as close as eager to a float64 run of the same sample.
With --grad (float32 and float64), the gradients of a weighted sum of the outputs (a fixed random weight
per element, so a wrong permutation or broadcast cannot cancel out) for every input that requires grad.
Each (op, dtype) is classified:

  pass   every sample that eager can run matches eager
  fail   a sample gives a different answer (a possible SILENT WRONG ANSWER: reported loudly)
  error  compiling or running with ember raised (type + first line of the message is kept)
  skip   eager cannot run any sample, the op is random / nondeterministic, or Dynamo/AOTAutograd
         itself cannot handle the op (the same sample also fails with backend="aot_eager")

Results are checked against tests/opinfo_expected_failures.json ({"op:dtype": "reason"}): an (op, dtype)
that fails/errors and is not listed, or is listed and passes, is "unexpected". A reason that starts
with "flaky" accepts either outcome.

    python -m scripts.opinfo_sweep --workers 2 --json sweep.json
    python -m scripts.opinfo_sweep --ops add,softmax --dtypes float32 -v
    python -m scripts.opinfo_sweep --grad --ops tanh,layer_norm          # float32 and float64 gradients
    python -m scripts.opinfo_sweep --dtypes float32 --offset-inputs 3     # inputs inside their storage
    python -m scripts.opinfo_sweep --dtypes float64 --float64-tol 1e-10   # float64 kept to float64's digits
    python -m scripts.opinfo_sweep --workers 2 --update-expected          # rewrite the expected file
"""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import time
import traceback
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECTED_PATH = os.path.join(ROOT, "tests", "opinfo_expected_failures.json")
DEFAULT_DTYPES = ("float32", "float16", "bfloat16", "int64", "bool")
GRAD_DTYPES = ("float32", "float64")

# Ops whose output is random or nondeterministic: comparing with eager means nothing.
RANDOM_RE = re.compile(
    r"(normal|bernoulli|rand|dropout|multinomial|uniform|exponential|geometric|cauchy|log_normal|"
    r"randperm|poisson|empty|new_empty|empty_like|empty_strided|empty_permuted|rrelu|"
    r"nn\.functional\.feature_alpha_dropout|alpha_dropout|torch\.empty)"
)


def is_random(op) -> bool:
    name = op.name + "." + op.variant_test_name if op.variant_test_name else op.name
    return bool(RANDOM_RE.search(name))


def op_key(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    line = msg[0] if msg else ""
    # Dynamo wraps backend errors: "backend='ember' raised:\nRuntimeError: ..." -> keep the inner line.
    if "backend=" in line and "raised" in line and len(msg) > 1:
        line = msg[1]
    return f"{type(e).__name__}: {line[:300]}"


class OpTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise OpTimeout("op timed out")


# ----------------------------------------------------------------------------------- one op, in a worker

_STATE: dict = {}


def _init_worker(threads: int):
    import torch
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import ember  # noqa: F401  registers the backend
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 1024
    if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
        torch._dynamo.config.accumulated_cache_size_limit = 4096
    ember.config.fallback_on_error = False
    load_ops()


def load_ops() -> dict:
    if "ops" not in _STATE:
        from torch.testing._internal.common_methods_invocations import op_db
        _STATE["ops"] = {op_key(op): op for op in op_db}
    return _STATE["ops"]


# One unit in the last place at 1.0: a half-precision result that differs from another by one rounding
# differs by at most this much relative to its size.
_ULP = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def _tol(dtype):
    """(rtol, atol) of the direct comparison with eager. float16 and bfloat16 allow one rounding step of
    the dtype (eager's own rounding), not ember.testing's looser test tolerances."""
    name = str(dtype).replace("torch.", "")
    if name in _ULP:
        return _ULP[name], 1e-5
    if name == "float64" and os.environ.get("OPINFO_FLOAT64_TOL"):      # --float64-tol, read by the workers too
        tol = float(os.environ["OPINFO_FLOAT64_TOL"])
        return tol, tol
    from ember.testing import default_tol
    return default_tol(dtype)


def _clone(tree, requires_grad=False, offset=0):
    """A copy of tree's tensors; with requires_grad, a tensor requires grad where the sample's does. With
    an offset, each strided tensor that does not overlap itself starts that many elements into a storage
    of its own, with the sample's strides (a graph input's storage offset reaches ember's wrapper)."""
    import torch
    import torch.utils._pytree as pytree

    def c(x):
        if not isinstance(x, torch.Tensor):
            return x
        if offset and x.layout == torch.strided and x.numel() and not torch._debug_has_internal_overlap(x):
            span = 1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride()))
            # the elements before the tensor hold the same values in every copy (as_strided may read them)
            y = torch.full((offset + span,), 3, dtype=x.dtype, device=x.device)
            y = y.as_strided(x.shape, x.stride(), offset)
            y.copy_(x.detach())
        else:
            y = x.detach().clone()
        if requires_grad and x.requires_grad:
            y.requires_grad_(True)
        return y
    return pytree.tree_map(c, tree)


def _upcast(tree, requires_grad=False):
    """tree with its floating tensors in float64 (complex in complex128), copied."""
    import torch
    import torch.utils._pytree as pytree

    def up(x):
        if not isinstance(x, torch.Tensor):
            return x
        y = x.detach().clone()
        if x.is_floating_point():
            y = y.to(torch.float64)
        elif x.is_complex():
            y = y.to(torch.complex128)
        if requires_grad and x.requires_grad:
            y.requires_grad_(True)
        return y
    return pytree.tree_map(up, tree)


def _grad_outputs(out):
    import torch
    import torch.utils._pytree as pytree
    return [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad
            and (o.is_floating_point() or o.is_complex())]


def weighted_loss(outs):
    """sum over outputs of sum(out * w), w a fixed random tensor of out's shape drawn for each output in
    turn (the same in every run): each element's gradient is its own weight, so a gradient with a wrong
    permutation, broadcast or sign cannot cancel out as it can under a plain sum. A complex output is
    weighted as its real view."""
    import torch
    total = 0
    for i, o in enumerate(outs):
        real = torch.view_as_real(o.resolve_conj()) if o.is_complex() else o
        gen = torch.Generator().manual_seed(7919 * (i + 1))
        w = torch.randn(real.shape, generator=gen, dtype=torch.float32).to(real.dtype)
        total = total + (real * w).sum()
    return total


def input_grads(args_kwargs, out):
    """Gradients of weighted_loss(out) for every input that requires grad (None: nothing to differentiate)."""
    import torch
    import torch.utils._pytree as pytree
    leaves = [x for x in pytree.tree_leaves(args_kwargs) if isinstance(x, torch.Tensor) and x.requires_grad]
    outs = _grad_outputs(out)
    if not leaves or not outs:
        return None
    return list(torch.autograd.grad(weighted_loss(outs), leaves, allow_unused=True))


def _compare(actual, expected, dtype):
    """Raise AssertionError when actual differs from expected."""
    import torch
    import torch.utils._pytree as pytree
    fa, fe = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    if len(fa) != len(fe):
        raise AssertionError(f"{len(fa)} values, eager has {len(fe)}")
    for i, (a, e) in enumerate(zip(fa, fe)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"value[{i}]: got {type(a).__name__}, eager a Tensor")
            if a.shape != e.shape:
                raise AssertionError(f"value[{i}]: shape {tuple(a.shape)} vs eager {tuple(e.shape)}")
            if a.dtype != e.dtype:
                raise AssertionError(f"value[{i}]: dtype {a.dtype} vs eager {e.dtype}")
            rtol, atol = _tol(e.dtype)
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, check_stride=False,
                                       check_device=True, msg=lambda m, i=i: f"value[{i}]: {m}")
        elif isinstance(e, float) and isinstance(a, float):
            if not (a == e or (a != a and e != e) or abs(a - e) <= 1e-5 * max(1.0, abs(e))):
                raise AssertionError(f"value[{i}]: {a} vs eager {e}")
        elif a != e:
            raise AssertionError(f"value[{i}]: {a!r} vs eager {e!r}")


def _reference(fn, inp, grad):
    """(outputs, inputs after the call) or (outputs, input gradients) of fn run in float64."""
    a64, k64 = _upcast(inp, grad)
    ref = fn(*a64, **k64)
    if grad:
        return ref, input_grads((a64, k64), ref)
    return ref, (a64, k64)


def _close_to_fp64(actual, expected, reference, dtype):
    """For a float mismatch: ember is fine if each value is as close as eager to the float64 reference.
    In float16/bfloat16 ember's error may exceed eager's by one rounding of the value (a single rounding
    of a value computed in float32 where eager's kernel rounded differently), no more; in float32 the
    largest error by twice eager's largest plus the direct tolerance."""
    import torch
    import torch.utils._pytree as pytree
    fa, fe, fr = pytree.tree_leaves(actual), pytree.tree_leaves(expected), pytree.tree_leaves(reference)
    if not (len(fa) == len(fe) == len(fr)):
        return False
    rtol, atol = _tol(dtype)
    half = str(dtype).replace("torch.", "") in _ULP
    for a, e, r in zip(fa, fe, fr):
        if not isinstance(e, torch.Tensor) or not (e.is_floating_point() or e.is_complex()):
            continue
        if not isinstance(a, torch.Tensor) or not isinstance(r, torch.Tensor) or r.shape != e.shape:
            return False
        a, e, r = a.detach(), e.detach(), r.detach()
        if e.is_complex():
            a, e, r = (torch.view_as_real(t.resolve_conj()) for t in (a, e, r.to(torch.complex128)))
        r = r.to(torch.float64)
        fin = torch.isfinite(r)
        if not torch.equal(torch.isnan(a), torch.isnan(e)) and not torch.equal(torch.isnan(a), torch.isnan(r)):
            return False
        ea = (a.double() - r).abs()[fin]
        ee = (e.double() - r).abs()[fin]
        if not ea.numel():
            continue
        if half:  # each element: eager's error plus one rounding
            if not bool((ea <= ee + rtol * r.abs()[fin] + atol).all()):
                return False
        # float32: the largest error at most twice eager's largest (an ill-conditioned sample, such as
        # logcumsumexp's gradient over values of 1e4, loses digits in both, not in the same elements)
        elif float(ea.max()) > 2 * float(ee.max()) + rtol * float(r.abs()[fin].max()) + atol:
            return False
    return True


def _sample_repr(sample, maxlen=300) -> str:
    import torch
    import torch.utils._pytree as pytree

    def d(x):
        if isinstance(x, torch.Tensor):
            s = f"T{list(x.shape)}:{str(x.dtype).replace('torch.', '')}"
            try:
                if x.layout == torch.strided and x.numel() and not x.is_contiguous():
                    s += f"(stride={x.stride()})"
            except Exception:  # noqa: BLE001
                s += f"({x.layout})"
            return s
        return x
    s = f"input={pytree.tree_map(d, sample.input)}, args={pytree.tree_map(d, tuple(sample.args))}, kwargs={pytree.tree_map(d, dict(sample.kwargs))}"
    return s[:maxlen]


def _run_sample(variant, sample, dtype, grad, offset=0):
    """-> (category, detail). category in pass/fail/error/skip/eager_error/nondeterministic.
    variant: the op's function or in-place variant.
    Forward: the outputs and every input after the call (in-place updates) are compared with eager.
    grad: the outputs and the gradients of weighted_loss for every input that requires grad."""
    import torch
    import torch._dynamo

    def fn(*a, **k):
        return variant(*a, **k)

    inp = ((sample.input, *sample.args), dict(sample.kwargs))

    def run(call):
        args_kwargs = _clone(inp, grad, offset)
        torch.manual_seed(0)
        out = call(*args_kwargs[0], **args_kwargs[1])
        return (out, input_grads(args_kwargs, out)) if grad else (out, args_kwargs)

    # eager, twice (a nondeterministic op is skipped)
    try:
        expected = run(fn)
        expected2 = run(fn)
    except Exception as e:  # noqa: BLE001
        return "eager_error", first_line(e)
    if grad and expected[1] is None:
        return "eager_error", "no differentiable float output/input"
    try:
        _compare(expected2, expected, dtype)
    except Exception:
        return "nondeterministic", "eager differs between two runs"

    def run_compiled(backend):
        torch._dynamo.reset()
        return run(torch.compile(fn, backend=backend))

    import ember
    graphs_before = ember.metrics.graphs_compiled
    try:
        actual = run_compiled("ember")
    except OpTimeout:
        raise
    except Exception as e:  # noqa: BLE001
        msg = first_line(e)
        # Is it ember's fault? Dynamo / AOTAutograd alone (aot_eager) on the same sample:
        try:
            run_compiled("aot_eager")
        except OpTimeout:
            raise
        except Exception as e2:  # noqa: BLE001
            return "skip", "aot_eager fails too: " + first_line(e2)
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{os.path.relpath(f.filename, ROOT)}:{f.lineno}" for f in reversed(tb)
                      if "/ember/" in f.filename), "")
        return "error", msg + (f"  [{where}]" if where else "")
    finally:
        torch._dynamo.reset()
    try:
        _compare(actual, expected, dtype)
    except Exception as e:  # noqa: BLE001
        if dtype.is_floating_point and dtype != torch.float64:
            try:
                reference = _reference(fn, inp, grad)
            except Exception:  # noqa: BLE001
                reference = None
            if reference is not None and _close_to_fp64(actual, expected, reference, dtype):
                return "pass", "matches float64 reference at least as well as eager"
        m = str(e).strip().splitlines()
        return "fail", f"{type(e).__name__}: " + " ".join(x.strip() for x in m[:6])[:600]
    if ember.metrics.graphs_compiled == graphs_before:
        return "pass", "vacuous: ember compiled no graph (Dynamo ran it all eagerly)"
    return "pass", ""


def run_op(task):
    """Worker entry: (op_key, dtype names, limit, grad, timeout) -> list of result dicts."""
    try:
        return _run_op(task)
    except Exception as e:  # noqa: BLE001  never lose a whole sweep to one odd op
        return [{"op": task[0], "dtype": dn, "status": "skip", "detail": "harness: " + first_line(e),
                 "samples": [], "seconds": 0.0} for dn in task[1]]


def _run_op(task):
    key, dtype_names, limit, grad, timeout, *more = task
    offset = more[0] if more else 0
    import torch
    op = _STATE["ops"][key]
    results = []
    supported = op.supported_dtypes("cpu")
    if grad:
        supported = set(op.supported_backward_dtypes("cpu")) & set(supported) if op.supports_autograd else set()
    t_op = time.time()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        for dn in dtype_names:
            dtype = getattr(torch, dn)
            if dtype not in supported:
                continue
            r = {"op": key, "dtype": dn, "status": "skip", "detail": "", "samples": [], "seconds": 0.0}
            results.append(r)
            t0 = time.time()
            if is_random(op):
                r["detail"] = "random op"
                continue
            try:
                torch.manual_seed(0)
                samples = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=grad), limit))
            except OpTimeout:
                raise
            except Exception as e:  # noqa: BLE001
                r["detail"] = "sample_inputs failed: " + first_line(e)
                continue
            # the in-place variant (add_, index_put_) updates its first input: compared after the call
            variants = [("", op.op)]
            if not grad and op.inplace_variant is not None:
                variants.append(("in-place ", op.inplace_variant))
            cats = []
            for s, (label, variant) in itertools.product(samples, variants):
                try:
                    cat, detail = _run_sample(variant, s, dtype, grad, offset)
                except OpTimeout:
                    raise
                except Exception as e:  # noqa: BLE001  (a bug in this script, or an odd sample)
                    cat, detail = "skip", "harness: " + first_line(e)
                cats.append(cat)
                r["samples"].append({"status": cat, "detail": detail, "sample": label + _sample_repr(s)})
            r["seconds"] = round(time.time() - t0, 2)
            for c in ("fail", "error", "pass"):
                if c in cats:
                    r["status"] = c
                    picked = next(x for x in r["samples"] if x["status"] == c)
                    r["detail"], r["sample"] = picked["detail"], picked["sample"]
                    break
            else:
                if not samples:
                    r["detail"] = "no samples"
                elif "nondeterministic" in cats:
                    r["detail"] = "nondeterministic in eager"
                elif "skip" in cats:
                    r["detail"] = next(x["detail"] for x in r["samples"] if x["status"] == "skip")
                else:
                    r["detail"] = "eager cannot run any sample: " + r["samples"][0]["detail"]
                r["eager_ok"] = "skip" in cats  # eager ran; only Dynamo/AOT could not
    except OpTimeout:
        done = {(x["op"], x["dtype"]) for x in results if x["status"] != "skip" or x["detail"]}
        for dn in dtype_names:
            dtype = getattr(torch, dn)
            if dtype in supported and (key, dn) not in done:
                results = [x for x in results if x["dtype"] != dn]
                results.append({"op": key, "dtype": dn, "status": "error",
                                "detail": f"Timeout: op exceeded {timeout}s", "samples": [], "seconds": timeout})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        import torch._dynamo
        torch._dynamo.reset()
    for r in results:
        r["op_seconds"] = round(time.time() - t_op, 2)
    return results


# ----------------------------------------------------------------------------------- driver

def load_expected(path=EXPECTED_PATH) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def classify_unexpected(results, expected, grad=False):
    """-> list of (key, what) for results that disagree with the expected-failures file."""
    out = []
    prefix = "grad:" if grad else ""
    for r in results:
        key = f"{prefix}{r['op']}:{r['dtype']}"
        if expected.get(key, "").startswith("flaky"):
            continue  # listed as flaky: either outcome is expected
        if r["status"] in ("fail", "error") and key not in expected:
            out.append((key, f"unexpected {r['status']}: {r['detail']}"))
        elif r["status"] == "pass" and key in expected:
            out.append((key, f"unexpected pass (listed as: {expected[key]})"))
    return out


def select_ops(names=None):
    from torch.testing._internal.common_methods_invocations import op_db
    keys = [op_key(op) for op in op_db]
    if names:
        want = set(names)
        keys = [k for k in keys if k in want or k.split(".", 1)[0] in want]
        missing = want - {k for k in keys} - {k.split(".", 1)[0] for k in keys}
        if missing:
            print(f"warning: no OpInfo named {sorted(missing)}", file=sys.stderr)
    return keys


def sweep(ops, dtypes, limit=3, grad=False, workers=1, timeout=120, progress=None, offset=0):
    tasks = [(k, tuple(dtypes), limit, grad, timeout, offset) for k in ops]
    results = []
    if workers <= 1:
        _init_worker(2)
        for i, t in enumerate(tasks):
            res = run_op(t)
            results.extend(res)
            if progress:
                progress(i + 1, len(tasks), t[0], res)
        return results
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(1,), maxtasksperchild=40) as pool:
        for i, res in enumerate(pool.imap_unordered(run_op, tasks)):
            results.extend(res)
            if progress:
                progress(i + 1, len(tasks), res[0]["op"] if res else "?", res)
    return results


def report(results, expected, grad=False, verbose=False, file=None):
    p = lambda *a: print(*a, file=file or sys.stdout)  # noqa: E731
    counts = Counter(r["status"] for r in results)
    p("\n=== OpInfo sweep" + (" (gradients)" if grad else "") + " ===")
    p("counts per (op, dtype): " + ", ".join(f"{c}={counts.get(c, 0)}" for c in ("pass", "fail", "error", "skip")))
    eager_ok = [r for r in results if r["status"] != "skip" or r.get("eager_ok")]
    npass = sum(r["status"] == "pass" for r in eager_ok)
    if eager_ok:
        p(f"pass rate over (op, dtype) pairs eager (and Dynamo) can run: {npass}/{len(eager_ok)} = "
          f"{100.0 * npass / len(eager_ok):.1f}%")
    nrun = sum(r["status"] in ("pass", "fail", "error") for r in results)
    if nrun:
        p(f"pass rate over pairs ember was asked to compile: {npass}/{nrun} = {100.0 * npass / nrun:.1f}%")
    vac = [r for r in results if r["status"] == "pass" and r["samples"]
           and all(x["detail"].startswith("vacuous") for x in r["samples"] if x["status"] == "pass")]
    if vac:
        p(f"  of the passes, {len(vac)} are vacuous (Dynamo gave ember no graph), e.g. "
          + ", ".join(sorted({r['op'] for r in vac})[:12]))
    for dt in sorted({r["dtype"] for r in results}):
        c = Counter(r["status"] for r in results if r["dtype"] == dt)
        p(f"  {dt:9s} " + " ".join(f"{k}={c.get(k, 0)}" for k in ("pass", "fail", "error", "skip")))
    fails = [r for r in results if r["status"] == "fail"]
    if fails:
        p(f"\n!!! {len(fails)} MISMATCHES (possible silent wrong answers) !!!")
        for r in sorted(fails, key=lambda r: (r["op"], r["dtype"])):
            p(f"  FAIL {r['op']}:{r['dtype']}: {r['detail']}\n       sample: {r.get('sample', '')}")
    errors = [r for r in results if r["status"] == "error"]
    if errors:
        p(f"\nerrors ({len(errors)}):")
        causes = Counter(re.sub(r"\d+", "N", r["detail"].split("  [")[0])[:140] for r in errors)
        p("  top causes:")
        for cause, n in causes.most_common(25):
            ex = [f"{r['op']}:{r['dtype']}" for r in errors
                  if re.sub(r"\d+", "N", r["detail"].split("  [")[0])[:140] == cause][:4]
            p(f"   {n:4d}  {cause}   e.g. {', '.join(ex)}")
        if verbose:
            for r in sorted(errors, key=lambda r: (r["op"], r["dtype"])):
                p(f"  ERROR {r['op']}:{r['dtype']}: {r['detail']}")
    if verbose:
        for r in sorted(results, key=lambda r: (r["op"], r["dtype"])):
            if r["status"] == "skip":
                p(f"  skip {r['op']}:{r['dtype']}: {r['detail'][:160]}")
    unexpected = classify_unexpected(results, expected, grad)
    if unexpected:
        p(f"\nUNEXPECTED ({len(unexpected)}) vs {os.path.relpath(EXPECTED_PATH, ROOT)}:")
        for k, w in unexpected:
            p(f"  {k}: {w[:300]}")
    else:
        p("\nno unexpected results")
    return unexpected


def reason_for(r) -> str:
    """A short, groupable reason for the expected-failures file."""
    d = r["detail"]
    if r["status"] == "fail":
        return "MISMATCH: " + d[:200]
    d = d.split("  [")[0]
    return d[:200]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant)")
    ap.add_argument("--skip-ops", help="comma-separated OpInfo names to leave out")
    ap.add_argument("--dtypes", help=f"default {','.join(DEFAULT_DTYPES)}; with --grad {','.join(GRAD_DTYPES)}")
    ap.add_argument("--limit-samples", type=int, default=3)
    ap.add_argument("--grad", action="store_true",
                    help="gradients of a weighted sum of the outputs (weighted_loss) for every input that requires grad")
    ap.add_argument("--offset-inputs", type=int, default=0, metavar="N",
                    help="each input tensor starts N elements into its storage (eager and ember alike)")
    ap.add_argument("--float64-tol", type=float, default=None, metavar="T",
                    help="rtol and atol of float64 against eager (default ember.testing's 1e-7; 1e-10 finds "
                         "float32 constants in float64 kernels)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per op (all its dtypes)")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--expected", default=EXPECTED_PATH)
    ap.add_argument("--update-expected", action="store_true",
                    help="rewrite the expected-failures file from this run (keeps entries for ops not run)")
    ap.add_argument("--start", type=int, default=0, help="skip the first N ops (for chunked runs)")
    ap.add_argument("--count", type=int, default=0, help="run at most N ops")
    ap.add_argument("--resume", action="store_true", help="keep the results in JSON+'l' and run only the other ops")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.float64_tol is not None:
        os.environ["OPINFO_FLOAT64_TOL"] = str(a.float64_tol)

    dtypes = [d.strip() for d in (a.dtypes or ",".join(GRAD_DTYPES if a.grad else DEFAULT_DTYPES)).split(",")
              if d.strip()]
    ops = select_ops(a.ops.split(",") if a.ops else None)
    if a.skip_ops:
        drop = set(a.skip_ops.split(","))
        ops = [k for k in ops if k not in drop and k.split(".", 1)[0] not in drop]
    ops = ops[a.start:]
    if a.count:
        ops = ops[:a.count]
    expected = load_expected(a.expected)
    prior = []
    if a.json and os.path.exists(a.json + "l"):
        if a.resume:
            with open(a.json + "l") as f:
                prior = [json.loads(x) for x in f if x.strip()]
            done = {r["op"] for r in prior}
            ops = [k for k in ops if k not in done]
        else:
            os.remove(a.json + "l")
    t0 = time.time()

    def progress(i, n, key, res):
        st = " ".join(f"{r['dtype']}={r['status']}" for r in res)
        bad = any(r["status"] == "fail" for r in res)
        print(f"[{i}/{n} {time.time() - t0:6.0f}s] {key}: {st}" + ("   <-- MISMATCH" if bad else ""), flush=True)
        if a.json:  # partial results survive an interrupted run
            with open(a.json + "l", "a") as f:
                for r in res:
                    f.write(json.dumps(r) + "\n")

    results = prior + sweep(ops, dtypes, a.limit_samples, a.grad, a.workers, a.timeout, progress,
                            a.offset_inputs)
    print(f"\n{len(ops)} ops in {time.time() - t0:.0f}s")
    unexpected = report(results, expected, a.grad, a.verbose)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results, "unexpected": unexpected}, f, indent=1)
    if a.update_expected:
        prefix = "grad:" if a.grad else ""
        ran = {f"{prefix}{r['op']}:{r['dtype']}" for r in results}
        new = {k: v for k, v in expected.items() if k not in ran}
        for r in results:
            if r["status"] in ("fail", "error"):
                new[f"{prefix}{r['op']}:{r['dtype']}"] = reason_for(r)
        with open(a.expected, "w") as f:
            json.dump(dict(sorted(new.items())), f, indent=1)
            f.write("\n")
        print(f"wrote {len(new)} entries to {a.expected}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
