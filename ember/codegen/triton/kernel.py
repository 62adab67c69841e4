"""One fused group -> one Triton kernel.

The kernel is an ops handler: each node's `store_body` runs under it with the node's index expressed in
the kernel's flat `xindex` / `rindex`, and every op appends a line. A reduction kernel is a sequence of
sections: a "loop" over row chunks (looped reductions) or straight-line code. A node that needs a
reduction finished in the current loop starts the next section; in a persistent reduction the whole row
is in registers and all nodes share one section.

A scan kernel (one Scan node) is a persistent or a looped "reduction" whose r axis is the scanned dim.

A store followed by a load of the same buffer at the same index in scope is forwarded (no memory
traffic); buffers that live only inside the kernel are never stored.
"""
from __future__ import annotations

import itertools
from typing import Optional

import sympy
import torch

from ... import config
from ...ir.symbolic import guard_le, is_static, simplify_index, size_symbols
from ...schedule.nodes import RINDEX, XINDEX
from ..kernel import ArgRegistry, KValue, Section, SectionedKernel, print_index, widest_kind
from . import heuristics
from .spelling import TritonSpelling, triton_type, compute_dtype

_IDENTITY = {"sum": 0, "prod": 1, "any": 0, "all": 1}
_ATOMIC_ADD_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)   # on GPUs and in the interpreter
_SCAN_FNS = {"add": "helpers.add", "mul": "helpers.prod", "logaddexp": "helpers.logaddexp"}
_SCAN_IDENTITY = {"add": "0", "mul": "1", "logaddexp": 'float("-inf")'}


class TritonKernel(TritonSpelling, SectionedKernel):
    def __init__(self, name: str, group, graph, local: set, materialize: set = frozenset(), tiling=None):
        self.name = name
        self.group = tiling or group.group
        self.tiled = tiling is not None        # a 2-D tiled pointwise kernel (see schedule/tiling.py)
        self.nodes = group.nodes
        self.graph = graph
        self.local = set(local) - set(materialize)
        X, R = self.group
        self.X, self.R = X, R
        self.has_rdim = R != 1
        self.has_scan = any(n.is_scan() for n in self.nodes)
        # a symbolic row is held whole when its example size is short, under a guard that it stays so
        if self.tiled or not self.has_rdim:
            self.persistent = self.tiled
        else:
            limit = heuristics.PERSISTENT_SCAN_MAX if self.has_scan else \
                heuristics.persistent_row_limit(self, config.persistent_reduction_max)
            self.persistent = guard_le(R, limit)
        # ... and then RBLOCK is chosen at launch, from the row's length
        self.rblock_at_launch = self.persistent and not self.tiled and not is_static(R)
        self.sections: list[Section] = []
        self.global_cache: dict = {}
        self.scope: dict[str, Optional[int]] = {}     # value name -> section id it is confined to
        self.stored: dict[str, dict] = {}             # storage -> index string -> value
        self.needs_store: set[str] = set()
        self.counter = itertools.count()
        self.args = ArgRegistry()
        reads = set().union(*(n.reads for n in self.nodes)) - self.local
        writes = set().union(*(n.writes for n in self.nodes)) - self.local
        for s in sorted(reads - writes):
            self.args.input(s)
        for s in sorted(writes):
            if s in reads:
                self.args.input(s)
            self.args.output(s)
        self.ranges = ((XINDEX, X), (RINDEX, R))
        self.use_int64 = heuristics.needs_int64(self.nodes, graph)
        self._tmp_values: dict[str, KValue] = {}      # indirect-index symbols -> their values

    # -- driving ---------------------------------------------------------------------------------------

    def single_section(self) -> bool:
        return not self.has_rdim or self.persistent

    # -- values ----------------------------------------------------------------------------------------

    def cse(self, expr: str, dtype, kind: str, where: str = "body", deps=None) -> KValue:
        """Name `expr` once. Row-invariant values (not "xr") whose inputs all live outside the current
        r-loop are hoisted in front of it (`deps` lists those inputs; None means "unknown": not hoisted)."""
        sec = self.section
        hit = self._cached(expr)
        if hit is not None:
            return hit
        if (sec.kind == "loop" and where == "body" and kind != "xr" and deps is not None
                and all(self.scope.get(d.name) is None for d in deps if isinstance(d, KValue))):
            where = "pre"
        v = KValue(f"tmp{next(self.counter)}", dtype, kind)
        getattr(sec, where).append(f"{v.name} = {expr}")
        if sec.kind == "flat" or where in ("post", "pre"):
            self.global_cache[expr] = v
            self.scope[v.name] = None
        else:
            sec.cache[expr] = v
            self.scope[v.name] = sec.id
        return v

    # -- indexing --------------------------------------------------------------------------------------

    def index_str(self, index) -> tuple[str, str]:
        """(printed index, kind of its shape)"""
        index = simplify_index(sympy.sympify(index), self.ranges)
        for s in size_symbols(index):
            self.args.size(s)
        syms = index.free_symbols
        kinds = [KValue("", torch.int32, k) for k, v in (("xr", RINDEX), ("x", XINDEX)) if v in syms]
        kinds += [self._tmp_values[s.name] for s in syms if s.name in self._tmp_values]
        kind = widest_kind(*kinds)
        return print_index(index), ("scalar" if kind == "const" else kind)

    def mask(self, kind: str) -> Optional[str]:
        if kind == "xr":
            return "xmask & rmask"
        if kind == "x":
            return "xmask"
        return None

    # -- memory ops ------------------------------------------------------------------------------------

    def load(self, name: str, index):
        idx, kind = self.index_str(index)
        fwd = self.stored.get(name, {}).get(idx)
        if fwd is not None and self._visible(fwd):
            return fwd
        if name in self.local:
            self.needs_store.add(name)
        if name in self.stored:
            # a value this kernel stored, at an index that did not print the same (so not forwarded):
            # another thread of this program may have written the element, so wait for every store so
            # far, both before the section (earlier sections) and right here (this one)
            self.section.barrier = True
            self.emit("tl.debug_barrier()")
        buf_dtype = self.graph.get_dtype(name)
        ptr = self.args.input(name)
        mask = self.mask(kind)
        if mask is None:
            expr = f"tl.load({ptr} + ({idx}))"
        else:
            expr = f"tl.load({ptr} + ({idx}), {mask}, other=0)"
        if buf_dtype == torch.bool:
            expr += ".to(tl.int1)"
        elif compute_dtype(buf_dtype) != buf_dtype:
            expr += f".to({triton_type(compute_dtype(buf_dtype))})"
        deps = [self._tmp_values[s.name] for s in sympy.sympify(index).free_symbols if s.name in self._tmp_values]
        return self.cse(expr, compute_dtype(buf_dtype), kind, deps=deps)

    def _store(self, name: str, index, value: KValue, where: str, mode=None):
        idx, kind = self.index_str(index)
        if mode is None:     # what an atomic add leaves there is not `value`: nothing to forward
            self.stored.setdefault(name, {})[idx] = value
        if kind == "scalar":
            # one element (a full reduction, a 0-d result): lane 0 of the block writes it
            idx, kind = f"{idx} + tl.zeros({self.shape('x')}, tl.int32)", "x"
        if name in self.local:
            return None
        ptr = self.args.output(name)
        buf_dtype = self.graph.get_dtype(name)
        val = self._broadcast(value, kind, buf_dtype)
        if buf_dtype == torch.bool:
            val = f"({val}).to(tl.int1)"
        elif value.dtype != buf_dtype:
            val = f"({val}).to({triton_type(buf_dtype)})"
        mask = self.mask(kind)
        if mode == "atomic_add":
            if buf_dtype not in _ATOMIC_ADD_DTYPES:
                raise NotImplementedError(f"atomic_add into a {buf_dtype} buffer")
            # relaxed: the kernel boundary orders the scatter against every reader of its buffer
            self.emit(f"tl.atomic_add({ptr} + ({idx}), {val}{', mask=' + mask if mask else ''}, sem='relaxed')", where)
            return None
        self.emit(f"tl.store({ptr} + ({idx}), {val}{', ' + mask if mask else ''})", where)
        return None

    def _broadcast(self, value: KValue, kind: str, dtype) -> str:
        shape = self.shape(kind)
        if value.kind == "const":
            return f"tl.full({shape}, {value.name}, {triton_type(compute_dtype(dtype))})"
        if value.kind != kind and shape != "[]":
            return f"tl.broadcast_to({value.name}, {shape})"
        return value.name

    def shape(self, kind: str) -> str:
        if kind == "xr":
            return "[XBLOCK, RBLOCK]"
        if kind == "x":
            return "[XBLOCK, 1]" if self.has_rdim else "[XBLOCK]"
        return "[]"

    def store_reduction(self, name, index, value):
        return self._store(name, index, value, "body" if self.persistent else "post")

    def index_expr(self, expr, dtype):
        idx, kind = self.index_str(expr)
        if kind == "scalar" and sympy.sympify(expr).is_Integer:
            return self.constant(int(expr), dtype)
        cast = "" if dtype == (torch.int64 if self.use_int64 else torch.int32) else f".to({triton_type(dtype)})"
        if kind == "scalar":
            # size arguments may arrive as constexpr (Triton specializes ints equal to 1): make a tensor
            idx = f"tl.full([], {idx}, tl.int64)"
            cast = "" if dtype == torch.int64 else f".to({triton_type(dtype)})"
        deps = [self._tmp_values[s.name] for s in sympy.sympify(expr).free_symbols if s.name in self._tmp_values]
        return self.cse(f"({idx}){cast}", dtype, kind, deps=deps)

    def indirect_indexing(self, value: KValue, size, check=True):
        size_s = print_index(size)
        for s in size_symbols(size):
            self.args.size(s)
        v = self.cse(f"tl.where({value} < 0, {value} + {size_s}, {value})", value.dtype, value.kind)
        self._tmp_values[v.name] = v
        return sympy.Symbol(v.name, integer=True, nonnegative=True)

    # -- reductions ------------------------------------------------------------------------------------

    def reduction(self, dtype, src_dtype, rtype, value: KValue):
        key = f"reduction:{rtype}:{value.name}"
        hit = self.section.cache.get(key) or self.global_cache.get(key)
        if hit is not None:
            return hit
        if not self.has_rdim:
            return self._single_element_reduction(dtype, rtype, value)
        out = self._persistent_reduction(dtype, rtype, value) if self.persistent else \
            self._looped_reduction(dtype, rtype, value)
        self.global_cache[key] = out
        return out

    def _single_element_reduction(self, dtype, rtype, value):
        """A reduction over one element (rnumel == 1): the kernel has no r axis; the result is the value."""
        if rtype in ("argmax", "argmin"):
            return self.constant(0, torch.int64)
        if rtype in ("any", "all"):
            return self.to_dtype(value, torch.bool)
        if rtype == "welford":
            return (value, self.constant(0.0, torch.float32), self.constant(1.0, torch.float32))
        if rtype == "online_softmax":
            return (value, self.cse(f"tl.exp({value.name} - {value.name})", dtype, value.kind))
        return self.to_dtype(value, dtype) if value.dtype != dtype else value

    def _identity(self, rtype, dtype) -> str:
        if rtype in ("max", "argmax"):
            return 'float("-inf")' if dtype.is_floating_point else str(torch.iinfo(dtype).min if dtype != torch.bool else 0)
        if rtype in ("min", "argmin"):
            return 'float("inf")' if dtype.is_floating_point else str(torch.iinfo(dtype).max if dtype != torch.bool else 1)
        return str(_IDENTITY.get(rtype, 0))

    def _combine_fn(self, rtype, dtype) -> str:
        fp = dtype.is_floating_point
        return {"max": "helpers.max_nan" if fp else "helpers.max_int",
                "min": "helpers.min_nan" if fp else "helpers.min_int",
                "prod": "helpers.prod", "any": "helpers.logical_or", "all": "helpers.logical_and"}[rtype]

    def _masked(self, value: KValue, rtype, dtype) -> str:
        ident = self._identity(rtype, dtype)
        v = value.name if value.kind != "const" else f"tl.full([XBLOCK, RBLOCK], {value.name}, {triton_type(dtype)})"
        if rtype in ("any", "all"):
            v = f"({v} != 0)"
            ident = "False" if rtype == "any" else "True"
        return f"tl.where(xmask & rmask, {v}, {ident})"

    def _persistent_reduction(self, dtype, rtype, value):
        src = value.dtype
        m = self.cse(self._masked(value, rtype, src), src, "xr")
        if rtype == "sum":
            return self.cse(f"tl.sum({m}, 1)[:, None]", dtype, "x")
        if rtype in ("argmax", "argmin"):
            idx = self.cse("tl.broadcast_to(rindex, [XBLOCK, RBLOCK])", torch.int64, "xr")
            n = next(self.counter)
            self.emit(f"_red{n}, _arg{n} = tl.reduce(({m}, {idx}), 1, helpers.{rtype}_combine)")
            return self.cse(f"_arg{n}[:, None].to(tl.int64)", torch.int64, "x")
        if rtype == "welford":
            w = self.cse("(xmask & rmask).to(tl.float32)", torch.float32, "xr")
            # two-pass in registers: exact mean first, then squared deviations
            mean = self.cse(f"(tl.sum({m}, 1) / tl.maximum(tl.sum({w}, 1), 1.0))[:, None]", dtype, "x")
            dev = self.cse(f"tl.where(xmask & rmask, {value.name} - {mean}, 0.0)", dtype, "xr")
            m2 = self.cse(f"tl.sum({dev} * {dev}, 1)[:, None]", dtype, "x")
            cnt = self.cse(f"tl.sum({w}, 1)[:, None]", dtype, "x")
            return (mean, m2, cnt)
        if rtype == "online_softmax":
            # the row is in registers: two passes over it, as eager computes (max, then sum of exp)
            mx = self.cse(f"tl.reduce({self._masked(value, 'max', src)}, 1, helpers.max_nan)[:, None]", dtype, "x")
            e = self.cse(f"tl.where(xmask & rmask, tl.exp({value.name} - {mx}), 0.0)", dtype, "xr")
            return (mx, self.cse(f"tl.sum({e}, 1)[:, None]", dtype, "x"))
        r = self.cse(f"tl.reduce({m}, 1, {self._combine_fn(rtype, src)})[:, None]", dtype, "x")
        return r if rtype not in ("any", "all") else self.cse(f"{r}.to(tl.int1)", torch.bool, "x")

    def _looped_softmax_stats(self, acc, value, dtype):
        """(max, sum of exp(v - max)) in one pass over a long row: each step takes the block's max (one
        reduction across the program's threads), rescales the lanes' sums once if the row's max grew (one
        exp per row) and adds exp(v - max) (one exp per element); the lanes share the row's max, so they
        merge by a plain sum. A per-lane running max instead costs ~17 operations per element, and on an
        H200 this ran 1.2x faster (scripts/kernel_variants_probe.py: cross-entropy over 32000 classes).
        Eager's values for odd rows: a -inf element adds nothing, +inf or nan make the sum nan (and nan the
        max), and a row of only -inf gets a nan sum."""
        sec = self.section
        tt = triton_type(dtype)
        v = value.name if value.kind != "const" else f"tl.full([XBLOCK, RBLOCK], {value.name}, {tt})"
        sec.pre += [f"{acc}_m = tl.full([XBLOCK, 1], float('-inf'), {tt})",
                    f"{acc}_s = tl.zeros([XBLOCK, RBLOCK], {tt})"]
        sec.body += [f"{acc}_v = tl.where(xmask & rmask, {v}, float('-inf'))",
                     f"{acc}_mn = helpers.maximum_nan({acc}_m, tl.reduce({acc}_v, 1, helpers.maximum_nan)[:, None])",
                     # the scale is 1 while the max holds (also -inf to -inf), exp(-inf) = 0 from an empty start
                     f"{acc}_sc = tl.where({acc}_m == {acc}_mn, 1.0, tl.exp({acc}_m - {acc}_mn))",
                     f"{acc}_s = {acc}_s * {acc}_sc + tl.exp({acc}_v - tl.where({acc}_mn == float('-inf'), 0.0, {acc}_mn))",
                     f"{acc}_m = {acc}_mn"]
        sec.post += [f"{acc}_r0 = {acc}_m",
                     f"{acc}_r1 = tl.where({acc}_m == float('-inf'), float('nan'), tl.sum({acc}_s, 1)[:, None])"]
        return tuple(self.cse(f"{acc}_r{i}", dtype, "x", where="post") for i in range(2))

    def _looped_reduction(self, dtype, rtype, value):
        sec = self.section
        n = next(self.counter)
        acc = f"_acc{n}"
        src = value.dtype
        tt = triton_type(src if rtype not in ("any", "all") else torch.bool)
        masked = self._masked(value, rtype, src)
        if rtype == "welford":
            sec.pre += [f"{acc}_mean = tl.zeros([XBLOCK, RBLOCK], tl.float32)",
                        f"{acc}_m2 = tl.zeros([XBLOCK, RBLOCK], tl.float32)",
                        f"{acc}_w = tl.zeros([XBLOCK, RBLOCK], tl.float32)"]
            v = value.name if value.kind != "const" else f"tl.full([XBLOCK, RBLOCK], {value.name}, tl.float32)"
            sec.body += [f"{acc}_wn = tl.where(xmask & rmask, {acc}_w + 1.0, {acc}_w)",
                         f"{acc}_d = {v} - {acc}_mean",
                         f"{acc}_mn = tl.where(xmask & rmask, {acc}_mean + {acc}_d / tl.maximum({acc}_wn, 1.0), {acc}_mean)",
                         f"{acc}_m2 = tl.where(xmask & rmask, {acc}_m2 + {acc}_d * ({v} - {acc}_mn), {acc}_m2)",
                         f"{acc}_mean = {acc}_mn", f"{acc}_w = {acc}_wn"]
            sec.post.append(f"{acc}_r0, {acc}_r1, {acc}_r2 = tl.reduce(({acc}_mean, {acc}_m2, {acc}_w), 1, helpers.welford_combine)")
            return tuple(self.cse(f"{acc}_r{i}[:, None]", dtype, "x", where="post") for i in range(3))
        if rtype == "online_softmax":
            return self._looped_softmax_stats(acc, value, dtype)
        if rtype in ("argmax", "argmin"):
            sec.pre += [f"{acc} = tl.full([XBLOCK, RBLOCK], {self._identity(rtype, src)}, {tt})",
                        f"{acc}_i = tl.full([XBLOCK, RBLOCK], 2147483647, tl.int64)"]
            sec.body += [f"{acc}_v, {acc}_j = helpers.{rtype}_combine({acc}, {acc}_i, {masked}, "
                         f"tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64))",
                         f"{acc} = tl.where(xmask & rmask, {acc}_v, {acc})",
                         f"{acc}_i = tl.where(xmask & rmask, {acc}_j, {acc}_i)"]
            sec.post.append(f"{acc}_r, {acc}_ri = tl.reduce(({acc}, {acc}_i), 1, helpers.{rtype}_combine)")
            return self.cse(f"{acc}_ri[:, None].to(tl.int64)", torch.int64, "x", where="post")
        sec.pre.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {self._identity(rtype, src) if rtype not in ('any', 'all') else ('False' if rtype == 'any' else 'True')}, {tt})")
        if rtype == "sum":
            sec.body.append(f"{acc} = {acc} + {masked}")
            return self.cse(f"tl.sum({acc}, 1)[:, None]", dtype, "x", where="post")
        sec.body.append(f"{acc} = {self._combine_fn(rtype, src)}({acc}, {masked})")
        r = self.cse(f"tl.reduce({acc}, 1, {self._combine_fn(rtype, src)})[:, None]", dtype, "x", where="post")
        return r if rtype not in ("any", "all") else self.cse(f"{r}.to(tl.int1)", torch.bool, "x", where="post")

    # -- scans ---------------------------------------------------------------------------------------------

    def scan(self, dtype, combine, value: KValue):
        """tl.associative_scan along r of the row chunk in the block (masked lanes hold the identity, so
        they change nothing); a looped kernel carries each row's running value into the next chunk."""
        if not self.has_rdim:
            return value           # a scan of one step is its value
        fn = _SCAN_FNS[combine]
        tt = triton_type(value.dtype)
        ident = _SCAN_IDENTITY[combine]
        v = value.name if value.kind != "const" else f"tl.full([XBLOCK, RBLOCK], {value.name}, {tt})"
        masked = self.cse(f"tl.where(xmask & rmask, {v}, {ident})", value.dtype, "xr")
        scanned = self.cse(f"tl.associative_scan({masked}, 1, {fn})", value.dtype, "xr")
        if self.persistent:
            return scanned
        carry = f"_carry{next(self.counter)}"
        self.emit(f"{carry} = tl.full([XBLOCK, 1], {ident}, {tt})", "pre")
        out = self.cse(f"{fn}({carry}, {scanned})", value.dtype, "xr")
        # the chunk's last column is the row's running value so far (lanes past the row hold the identity)
        self.emit(f"{carry} = tl.sum(tl.where(rbase == RBLOCK - 1, {out}, 0), 1)[:, None].to({tt})")
        return out

    # -- source ----------------------------------------------------------------------------------------

    def signature(self) -> list[str]:
        params = [p for p, _ in self.args.call_order()]
        params.append("xnumel")
        if self.has_rdim:
            params.append("rnumel")
        params += list(self.args.sizes.values())
        return params

    def has_loop(self) -> bool:
        return any(sec.kind == "loop" for sec in self.sections)

    def loop_pipelinable(self) -> bool:
        """May Triton software-pipeline the r-loops (issue the next chunks' loads while one is reduced)?
        Only where no load can depend on a store of this kernel: no buffer both read and written (an
        in_out_ptr) and no barrier between sections that hand values through memory."""
        return self.has_loop() and not any(sec.barrier for sec in self.sections) and \
            not any(p.startswith("in_out_ptr") for p in self.args.outputs.values())

    def source(self) -> str:
        consts = ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if self.has_rdim else [])
        if self.has_loop():
            consts.append("RSTAGES: tl.constexpr")
        lines = ["@triton.jit", f"def {self.name}({', '.join(self.signature() + consts)}):"]
        body = []
        pid = "tl.program_id(0).to(tl.int64)" if self.use_int64 else "tl.program_id(0)"
        body.append(f"xoffset = {pid} * XBLOCK")
        if self.has_rdim:
            body += ["xindex = xoffset + tl.arange(0, XBLOCK)[:, None]", "xmask = xindex < xnumel",
                     "rbase = tl.arange(0, RBLOCK)[None, :]"]
            if self.tiled:
                body += ["rindex = tl.program_id(1) * RBLOCK + rbase", "rmask = rindex < rnumel"]
            elif self.persistent:
                body += ["rindex = rbase", "rmask = rindex < rnumel"]
        else:
            body += ["xindex = xoffset + tl.arange(0, XBLOCK)", "xmask = xindex < xnumel"]
        for sec in self.sections:
            if sec.kind == "loop":
                if sec.barrier:
                    body.append("tl.debug_barrier()")      # values hoisted into `pre` load before the loop
                body += sec.pre
                # RSTAGES > 1 (a launch config, heuristics.py) lets Triton keep that many chunks' loads in flight
                body.append("for roffset in tl.range(0, rnumel, RBLOCK, num_stages=RSTAGES):")
                inner = ["rindex = roffset + rbase", "rmask = rindex < rnumel"]
                if sec.barrier:
                    inner.append("tl.debug_barrier()")
                body += ["    " + ln for ln in inner + sec.body]
                body += sec.post
            else:
                if sec.barrier:
                    body.append("tl.debug_barrier()")
                body += sec.pre + sec.body + sec.post
        lines += ["    " + ln for ln in body]
        return "\n".join(lines) + "\n"

    def launch_config(self) -> dict:
        return heuristics.launch_config(self)
