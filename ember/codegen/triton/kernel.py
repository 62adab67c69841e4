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
from ...ir.op_table import REDUCTIONS, SCANS, compute_dtype
from ...ir.symbolic import guard_le, is_static, simplify_index, size_symbols
from ...schedule.nodes import RINDEX, XINDEX
from ..kernel import ArgRegistry, KValue, Section, SectionedKernel, literal, print_index, widest_kind
from ..reduction_steps import (softmax_stats_finish, softmax_stats_shared_max_step, welford_reciprocal,
                               welford_update)
from . import heuristics
from .spelling import TritonExprs, TritonSpelling, combine_fn, triton_type

_ATOMIC_ADD_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)   # on GPUs and in the interpreter
_SCAN_FNS = {"add": "helpers.add", "mul": "helpers.prod", "logaddexp": "helpers.logaddexp"}


class TritonKernel(TritonSpelling, SectionedKernel):
    # positions of elements that vary between otherwise identical kernels are parameters (Buffer.elements_vary)
    element_arguments = True

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
        # a part of a combined kernel (codegen/triton/combined.py) is handed its program's index as `pid`
        self.pid_param = False

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

    def _value(self, expr: str, dtype, kind: str, operands, costly: bool) -> KValue:
        self.math_heavy |= costly
        return self.cse(expr, dtype, kind, deps=operands)

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

    def _element(self, name: str, index) -> Optional[tuple[str, str]]:
        """(the parameter holding the position, "scalar") for a load of a constant element of a buffer whose
        elements vary between otherwise identical kernels (a random op's seed); None for any other load."""
        index = sympy.sympify(index)
        if not (self.element_arguments and index.is_Integer and
                getattr(self.graph.get_buffer(name), "elements_vary", False)):
            return None
        return self.args.element(name, int(index)), "scalar"

    def mask(self, kind: str) -> Optional[str]:
        if kind == "xr":
            return "xmask & rmask"
        if kind == "x":
            return "xmask"
        return None

    # -- memory ops ------------------------------------------------------------------------------------

    def load(self, name: str, index):
        idx, kind = self._element(name, index) or self.index_str(index)
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
        ptr = self.args.accumulate(name) if mode == "atomic_add" else self.args.output(name)
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

    def _reduce(self, dtype, src_dtype, rtype, value: KValue):
        if self.persistent:
            return self._persistent_reduction(dtype, rtype, value)
        return self._looped_reduction(dtype, rtype, value)

    def _block(self, value: KValue, dtype) -> str:
        """`value` as an [XBLOCK, RBLOCK] block (a literal becomes one)."""
        return value.name if value.kind != "const" else f"tl.full([XBLOCK, RBLOCK], {value.name}, {triton_type(dtype)})"

    def _masked(self, value: KValue, rtype, acc_dtype) -> str:
        """`value` as the reduction's accumulator dtype, with the reduction's identity in lanes past the row
        (they change nothing)."""
        v = self._block(value, value.dtype)
        if acc_dtype == torch.bool:
            v = f"({v} != 0)"
        elif acc_dtype != value.dtype:
            v = f"{v}.to({triton_type(acc_dtype)})"
        ident = REDUCTIONS[rtype].identity(acc_dtype)
        if rtype in ("argmax", "argmin"):
            ident = ident[0]
        return f"tl.where(xmask & rmask, {v}, {literal(ident)})"

    def _persistent_reduction(self, dtype, rtype, value):
        red = REDUCTIONS[rtype]
        acc_dt = red.accumulator_dtype(dtype, value.dtype)
        # welford's two passes sum the values, softmax's first pass takes their max
        masked_as = {"welford": "sum", "online_softmax": "max"}.get(rtype, rtype)
        m = self.cse(self._masked(value, masked_as, acc_dt), acc_dt, "xr")
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
            mx = self.cse(f"tl.reduce({m}, 1, helpers.max_nan)[:, None]", dtype, "x")
            e = self.cse(f"tl.where(xmask & rmask, tl.exp({value.name} - {mx}), 0.0)", dtype, "xr")
            return (mx, self.cse(f"tl.sum({e}, 1)[:, None]", dtype, "x"))
        r = self.cse(f"tl.reduce({m}, 1, {combine_fn(red.combine, acc_dt)})[:, None]", red.result_dtype(dtype), "x")
        return r if acc_dt != torch.bool else self.cse(f"{r}.to(tl.int1)", torch.bool, "x")

    def _looped_softmax_stats(self, acc, value, dtype):
        """(max, sum of exp(v - max)) in one pass over a long row, the shared-max strategy
        (reduction_steps.softmax_stats_shared_max_step): each step takes the block's max (one reduction
        across the program's threads), rescales the lanes' sums once if the row's max grew (one exp per
        row) and adds exp(v - max) (one exp per element); the lanes share the row's max, so they merge by
        a plain sum. A per-lane running max instead costs ~17 operations per element; the shared max runs
        faster (docs/performance.md, "Cross-entropy's statistics read each row once";
        `python -m experiments.kernel_variants_probe`: cross-entropy over 32000 classes)."""
        sec = self.section
        tt = triton_type(dtype)
        m0, s0 = REDUCTIONS["online_softmax"].identity(dtype)
        sec.pre += [f"{acc}_m = tl.full([XBLOCK, 1], {literal(m0)}, {tt})",
                    f"{acc}_s = tl.full([XBLOCK, RBLOCK], {literal(s0)}, {tt})"]
        b = TritonExprs(acc)
        v = b.let(f"tl.where(xmask & rmask, {self._block(value, dtype)}, {literal(m0)})", "v")
        block_max = f"tl.reduce({v}, 1, helpers.maximum_nan)[:, None]"
        m, s = softmax_stats_shared_max_step(b, f"{acc}_m", f"{acc}_s", v, block_max)
        sec.body += b.lines + [f"{acc}_s = {s}", f"{acc}_m = {m}"]
        stats = softmax_stats_finish(b, f"{acc}_m", f"tl.sum({acc}_s, 1)[:, None]")
        return tuple(self.cse(e, dtype, "x", where="post") for e in stats)

    def _looped_welford(self, acc, value, dtype):
        """reduction_steps.welford_update in every lane of the block; lanes past the row keep their state.
        The lanes' states merge after the loop (helpers.welford_combine)."""
        sec = self.section
        tt = triton_type(dtype)
        state = [f"{acc}_mean", f"{acc}_m2", f"{acc}_w"]
        sec.pre += [f"{n} = tl.full([XBLOCK, RBLOCK], {literal(i)}, {tt})"
                    for n, i in zip(state, REDUCTIONS["welford"].identity(dtype))]
        b = TritonExprs(acc)
        new = welford_update(b, *state, self._block(value, dtype), welford_reciprocal(b, state[2]))
        sec.body += b.lines + [f"{n} = tl.where(xmask & rmask, {e}, {n})" for n, e in zip(state, new)]
        sec.post.append(f"{acc}_r0, {acc}_r1, {acc}_r2 = tl.reduce(({', '.join(state)}), 1, helpers.welford_combine)")
        return tuple(self.cse(f"{acc}_r{i}[:, None]", dtype, "x", where="post") for i in range(3))

    def _looped_reduction(self, dtype, rtype, value):
        sec = self.section
        acc = f"_acc{next(self.counter)}"
        if rtype == "welford":
            return self._looped_welford(acc, value, dtype)
        if rtype == "online_softmax":
            return self._looped_softmax_stats(acc, value, dtype)
        red = REDUCTIONS[rtype]
        acc_dt = red.accumulator_dtype(dtype, value.dtype)
        tt = triton_type(acc_dt)
        masked = self._masked(value, rtype, acc_dt)
        if rtype in ("argmax", "argmin"):
            ident, index = red.identity(acc_dt)
            sec.pre += [f"{acc} = tl.full([XBLOCK, RBLOCK], {literal(ident)}, {tt})",
                        f"{acc}_i = tl.full([XBLOCK, RBLOCK], {index}, tl.int64)"]
            sec.body += [f"{acc}_v, {acc}_j = helpers.{rtype}_combine({acc}, {acc}_i, {masked}, "
                         f"tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64))",
                         f"{acc} = tl.where(xmask & rmask, {acc}_v, {acc})",
                         f"{acc}_i = tl.where(xmask & rmask, {acc}_j, {acc}_i)"]
            sec.post.append(f"{acc}_r, {acc}_ri = tl.reduce(({acc}, {acc}_i), 1, helpers.{rtype}_combine)")
            return self.cse(f"{acc}_ri[:, None].to(tl.int64)", torch.int64, "x", where="post")
        sec.pre.append(f"{acc} = tl.full([XBLOCK, RBLOCK], {literal(red.identity(acc_dt))}, {tt})")
        if rtype == "sum":
            sec.body.append(f"{acc} = {acc} + {masked}")
            return self.cse(f"tl.sum({acc}, 1)[:, None]", dtype, "x", where="post")
        fn = combine_fn(red.combine, acc_dt)
        sec.body.append(f"{acc} = {fn}({acc}, {masked})")
        r = self.cse(f"tl.reduce({acc}, 1, {fn})[:, None]", red.result_dtype(dtype), "x", where="post")
        return r if acc_dt != torch.bool else self.cse(f"{r}.to(tl.int1)", torch.bool, "x", where="post")

    # -- scans ---------------------------------------------------------------------------------------------

    def scan(self, dtype, combine, value: KValue):
        """tl.associative_scan along r of the row chunk in the block (masked lanes hold the identity, so
        they change nothing); a looped kernel carries each row's running value into the next chunk."""
        if not self.has_rdim:
            return value           # a scan of one step is its value
        fn = _SCAN_FNS[combine]
        tt = triton_type(value.dtype)
        ident = literal(SCANS[combine].identity(value.dtype))
        v = self._block(value, value.dtype)
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
        params = [p for p, _ in self.args.call_order()] + list(self.args.elements.values())
        params.append("xnumel")
        if self.has_rdim:
            params.append("rnumel")
        params += list(self.args.sizes.values())
        if self.pid_param:
            params.append("pid")
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
        # an element's position is not specialized on (Triton would for 1 and multiples of 16): one binary
        # serves every position
        jit = "@triton.jit" if not self.args.elements else \
            f"@triton.jit(do_not_specialize={list(self.args.elements.values())!r})"
        lines = [jit, f"def {self.name}({', '.join(self.signature() + consts)}):"]
        body = []
        pid = "pid" if self.pid_param else "tl.program_id(0)"
        if self.use_int64:
            pid += ".to(tl.int64)"
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
