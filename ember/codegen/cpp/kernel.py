"""One fused group -> one C++ function: OpenMP threads over rows (`xindex`), SIMD within.

The kernel is an ops handler like the Triton one: each node's `store_body` runs under it with the
node's index in the kernel's flat `xindex` / `rindex`, and every op appends a typed statement. A
pointwise kernel is one loop over xindex, split into chunks for threads with a `#pragma omp simd` loop
inside each, and what no element's index changes (loads at fixed positions, what they compute) computed
once before it; when its flat indices take floors and moduli of xindex (broadcast or permuted inputs,
each a gather in a SIMD loop) it runs as rows instead (indexing.choose_rows): xindex becomes (row,
element), a SIMD loop per row, values of the row alone computed before it. Transposes run as tiles.
A reduction kernel runs each row on one thread as a sequence of sections: a "loop" over the row, or
straight-line ("flat") code for x-only nodes. A node that reads a reduction finished in the current
loop starts the next loop; a costly value a later loop would recompute (softmax's exp) is kept in a
per-thread row buffer instead.

Reductions accumulate into independent lanes (lane = rindex % lanes within a chunk: LANES for long
rows, MIN_ROW for short ones) and combine the lanes after the loop: the lanes never depend on each
other, so the row loop is legal to vectorize for every reduction type, NaN-propagating max and Welford
included, without -ffast-math.

When rows are read with a stride (column sums: `a.sum(0)`) or are shorter than a vector, the kernel
runs "x-lanes" instead: each thread takes blocks of XLANES consecutive rows, and the SIMD loop goes
across the rows of a block (contiguous in memory) inside the loop over r. Row results then live in
arrays of XLANES (`tmp5[xl]`), one element per row of the block.

A scan kernel (one Scan node, its steps along r) runs each row as one serial loop carrying the running
value, rows split between threads; where the rows are not contiguous in memory it runs x-lanes instead,
carrying XLANES running values and vectorizing across them.

A store followed by a load of the same buffer at the same index in scope is forwarded (no memory
traffic); buffers that live only inside the kernel are never stored.
"""
from __future__ import annotations

import itertools
import re
from typing import Optional

import sympy
import torch

from ...ir.op_table import REDUCTIONS, SCANS, compute_dtype
from ...ir.symbolic import expand_index, simplify_index, size_symbols
from ...schedule.nodes import RINDEX, XINDEX, canonical
from ..kernel import ArgRegistry, KValue, Section, SectionedKernel, widest_kind
from ..reduction_steps import softmax_stats_finish, softmax_stats_lane_step, welford_reciprocal, welford_update
from .indexing import MIN_ROW, SizeNames, cpp_index, split_rows
from .spelling import CppExprs, CppSpelling, c_literal, ctype, load_expr, storage_type, store_expr
from .prelude import LANES

XCHUNK = 1024               # elements of a pointwise kernel per SIMD loop (and per scheduling unit)
PARALLEL_MIN_WORK = 32768   # below this many elements the thread team costs more than it saves
TILE_OUTER, TILE_SIMD = 16, 16   # tiled (transpose-like) pointwise kernels: tile extent across / along SIMD
XLANES = 64                 # rows per block in x-lanes mode: a few vectors, and whole cache lines per row
# rows at least this long accumulate in LANES lanes (several vectors, to hide the add's latency); shorter
# ones in MIN_ROW (one vector), whose combine after each row costs less
LONG_ROW = 1024

_VALUE_NAME = re.compile(r"\btmp\d+\b")
_VID = re.compile(r"\bv(\d+)\b")

_SCAN_STEP = {"add": "{0} + {1}", "mul": "{0} * {1}", "logaddexp": "ember::logaddexp({0}, {1})"}


def _block(statements: list[str]) -> str:
    """Statements as one line of their own scope."""
    return "{ " + " ".join(statements) + " }"


def _tree(step: str, acc: str, lanes: int) -> list[str]:
    """Combine lanes pairwise, `step` formatted with {0} = acc, {lo} and {hi} = the two lanes: log2(lanes)
    loops of constant width instead of one serial chain per row."""
    return [f"for (int ember_l = 0; ember_l < {w}; ++ember_l) " + step.format(acc, lo="ember_l", hi=f"ember_l + {w}")
            for w in (lanes >> k for k in range(1, lanes.bit_length()))]


class CppKernel(CppSpelling, SectionedKernel):
    def __init__(self, name: str, group, graph, local: set, materialize: set = frozenset(), tiling=None,
                 rows=None):
        self.name = name
        self.group = tiling or group.group
        self.tiled = tiling is not None               # a 2-D tiled pointwise kernel (schedule/tiling.py)
        # a pointwise kernel run as rows of `rows` elements (indexing.choose_rows): its node indices stay
        # flat, and index_str rewrites xindex as (row, element)
        self.rows = rows if rows is not None and not self.tiled else None
        self.nodes = group.nodes
        self.graph = graph
        self.local = set(local) - set(materialize)
        X, R = self.group
        if self.rows is not None:
            X, R = sympy.cancel(X / self.rows), self.rows
        self.X, self.R = X, R
        self.has_rdim = R != 1
        self.lanes = LANES if self._hint(R) >= LONG_ROW else MIN_ROW
        self.sections: list[Section] = []
        self.global_cache: dict = {}
        self.scope: dict[str, Optional[int]] = {}     # value name -> section id it is confined to
        self.stored: dict[str, dict] = {}             # storage -> index string -> value
        self.needs_store: set[str] = set()
        self.counter = itertools.count()
        self.args = ArgRegistry()
        self.size_names = SizeNames()                 # compound size expressions, computed once per call
        reads = set().union(*(n.reads for n in self.nodes)) - self.local
        writes = set().union(*(n.writes for n in self.nodes)) - self.local
        # pointer kinds are settled before any code names a pointer: a buffer read and written is one
        # in_out pointer from the start
        for s in sorted(reads):
            self.args.input(s)
        for s in sorted(writes):
            self.args.output(s)
        self.ranges = ((XINDEX, X), (RINDEX, R))
        self.checks = False                           # any indirect index is bounds-checked
        self.atomics = False                          # any store is an atomic read-modify-write
        self._tmp_values: dict[str, KValue] = {}      # indirect-index symbols -> their values
        self.has_scan = any(n.is_scan() for n in self.nodes)
        self.xlanes = self.has_rdim and not self.tiled and self.rows is None and \
            (self._scan_prefers_xlanes() if self.has_scan else self._prefers_xlanes())
        self.simd_x = self.tiled and self._prefers_xlanes(stores=2)    # tiled: SIMD along x, not r
        self.stage: list[tuple] = []                  # tiled: loads staged through an L1 tile buffer
        self.decls: list[str] = []                    # x-lanes: per-row arrays, declared per block
        self._where: dict[str, str] = {}              # value name -> section part it is computed in
        # values a later row loop would recompute (softmax's exp in the sum and in the output): kept in
        # a per-thread row buffer instead. Values are matched by structure: an id per distinct expression
        # over operand ids (names differ between sections).
        self._vid: dict[str, int] = {}                # value name -> structural id
        self._ids: dict[str, int] = {}                # expression over operand ids -> id
        self._costly: set[int] = set()                # ids of transcendental values (op table) and values of them
        self._loop_values: dict[int, tuple] = {}      # id -> (value, section) of its first row-loop value
        self.row_bufs: dict[int, tuple] = {}          # id -> (row buffer name, C++ type)

    def _hint(self, size) -> int:
        try:
            return int(sympy.sympify(size).subs(getattr(self.graph, "symbol_hints", {})))
        except (TypeError, ValueError):
            return 0

    def _prefers_xlanes(self, stores: int = 0) -> bool:
        """Vectorize across rows when the reads walk memory along x rather than along r, or when rows
        are too short to fill the lanes of a row loop."""
        hints = getattr(self.graph, "symbol_hints", {})
        try:
            X, R = (int(sympy.sympify(e).subs(hints)) for e in (self.X, self.R))
        except (TypeError, ValueError):
            return False
        if X < 2:
            return False
        along_r = along_x = 0
        for n in self.nodes:
            subs = n.flat_vars(self.group)
            for d, w in [(d, 1) for d in n.read_deps] + [(d, stores) for d in n.write_deps]:
                e = expand_index(canonical(d.index, subs, self.group))
                # an access without x (a LayerNorm's per-token statistics read by its weight-gradient
                # column sums) is one vector shared by every row: cheap in either mode, so only the
                # accesses over the whole (x, r) plane vote
                if RINDEX not in e.free_symbols or XINDEX not in e.free_symbols or not w:
                    continue
                if e.coeff(RINDEX) == 1:
                    along_r += w
                elif e.coeff(XINDEX) == 1:
                    along_x += w
        return along_x > along_r or R < MIN_ROW

    def _scan_prefers_xlanes(self) -> bool:
        """A scan's steps run in order, so a row is a serial loop: the right loop where the row is
        contiguous in memory (forwards or backwards). Otherwise (a scan along an outer dim) the SIMD loop
        goes across rows, which then lie side by side in memory, inside the loop over steps."""
        if self._hint(self.X) < 2:
            return False
        for n in self.nodes:
            subs = n.flat_vars(self.group)
            for d in n.read_deps:
                e = expand_index(canonical(d.index, subs, self.group))
                if e.coeff(RINDEX) in (1, -1):
                    return False
        return True

    # -- driving ---------------------------------------------------------------------------------------

    def single_section(self) -> bool:
        return not self.has_rdim or self.tiled or self.rows is not None

    def _value(self, expr: str, dtype, kind: str, operands, costly: bool) -> KValue:
        return self.cse(expr, dtype, kind, costly=costly)

    def cse(self, expr: str, dtype, kind: str, where: str = "body", costly: bool = False) -> KValue:
        """Name `expr` once; `costly`: the op table calls the op computing it transcendental."""
        sec = self.section
        hit = self._cached(expr)
        if hit is not None:
            return hit
        vid = self._structural_id(expr, costly)
        global_ = sec.kind == "flat" or where != "body"
        in_row_loop = sec.kind == "loop" and where == "body" and kind == "xr" and not self.xlanes
        if in_row_loop and vid in self._costly and dtype.is_floating_point and vid in self._loop_values:
            expr = self._row_buffer(vid, dtype) + "[rindex]"
        if self.rows is not None and where == "body" and kind in ("x", "scalar"):
            where = "pre"             # one value per row: computed before the row's SIMD loop
        elif not global_ and kind in ("x", "scalar") and not self.xlanes:
            # the same for every element of the row: compute it once, before the loop over r (an
            # x-indexed load never reads what this loop writes, whose stores all depend on r)
            where = "pre"
        elif kind == "scalar" and where == "body" and not self.has_rdim and self.rows is None:
            # the same for every element of a flat kernel (an optimizer's bias corrections from its 0-d step
            # count, a pow per element otherwise): computed once, before the threads' loop
            where = "pre"
        name = f"tmp{next(self.counter)}"
        if global_ and self.xlanes:
            self.decls.append(f"{ctype(dtype)} {name}[{XLANES}];")
            v = KValue(f"{name}[xl]", dtype, kind)
            getattr(sec, where).append(f"{v.name} = {expr};")
        else:
            v = KValue(name, dtype, kind)
            getattr(sec, where).append(f"{ctype(dtype)} {v.name} = {expr};")
        self._remember(expr, v, global_)
        self._where[v.name] = where
        self._vid[v.name] = vid
        if in_row_loop:
            self._loop_values.setdefault(vid, (v, sec))
        return v

    def _structural_id(self, expr: str, costly: bool) -> int:
        """The id of `expr` over its operands' ids; costly if it is, or if any operand is."""
        key = _VALUE_NAME.sub(lambda m: f"v{self._vid[m.group(0)]}" if m.group(0) in self._vid else m.group(0), expr)
        vid = self._ids.setdefault(key, len(self._ids))
        if costly or any(int(i) in self._costly for i in _VID.findall(key)):
            self._costly.add(vid)
        return vid

    def _row_buffer(self, vid: int, dtype) -> str:
        """The row buffer holding value `vid`, stored by the row loop that first computed it."""
        if vid not in self.row_bufs:
            first, sec = self._loop_values[vid]
            name = f"ember_row{len(self.row_bufs)}"
            self.row_bufs[vid] = (name, ctype(dtype))
            sec.body.append(f"{name}[rindex] = {first};")
        return self.row_bufs[vid][0]

    def _remember(self, expr: str, v: KValue, global_: bool):
        if global_:
            self.global_cache[expr] = v
            self.scope[v.name] = None
        else:
            self.section.cache[expr] = v
            self.scope[v.name] = self.section.id

    # -- indexing --------------------------------------------------------------------------------------

    def index_str(self, index) -> tuple[str, str]:
        """(printed index, kind of value it gives)"""
        if self.rows is not None:
            index = split_rows(index, self.group[0], self.rows)
        else:
            index = simplify_index(sympy.sympify(index), self.ranges)
        for s in size_symbols(index):
            self.args.size(s)
        syms = index.free_symbols
        kinds = [KValue("", torch.int64, k) for k, v in (("xr", RINDEX), ("x", XINDEX)) if v in syms]
        kinds += [self._tmp_values[s.name] for s in syms if s.name in self._tmp_values]
        kind = widest_kind(*kinds)
        return cpp_index(self.size_names(index)), ("scalar" if kind == "const" else kind)

    # -- memory ops ------------------------------------------------------------------------------------

    def load(self, name: str, index):
        idx, kind = self.index_str(index)
        fwd = self.stored.get(name, {}).get(idx)
        if fwd is not None and self._visible(fwd):
            return fwd
        if name in self.local:
            self.needs_store.add(name)
        buf_dtype = self.graph.get_dtype(name)
        ptr = self.args.input(name)
        step = self._tile_stride(name, index) if self.tiled else None
        if step is not None:
            return self._staged_load(ptr, idx, buf_dtype, step)
        return self.cse(load_expr(f"{ptr}[{idx}]", buf_dtype), compute_dtype(buf_dtype), kind)

    def _tile_stride(self, name: str, index) -> Optional[int]:
        """For a tiled kernel's load contiguous along the non-SIMD axis only (the transposed side): its
        stride along the SIMD axis; else None."""
        if name in self.args.outputs or name in self.local:
            return None
        # the index within one tile (tiles start at multiples of the tile extents): a flattened dim whose
        # extent the tile divides is contiguous there, though `xindex % n` hides it in the whole index
        TX, TR = (TILE_SIMD, TILE_OUTER) if self.simd_x else (TILE_OUTER, TILE_SIMD)
        xt, xl, rt, rl = sympy.symbols("ember_xt ember_xl ember_rt ember_rl", integer=True, nonnegative=True)
        e = simplify_index(sympy.sympify(index), self.ranges).xreplace({XINDEX: TX * xt + xl, RINDEX: TR * rt + rl})
        bounds = ((xl, TX), (rl, TR))
        e = expand_index(simplify_index(expand_index(e), bounds))
        if any(f.free_symbols & {xl, rl} for f in e.atoms(sympy.Function)):
            return None
        simd, outer = (xl, rl) if self.simd_x else (rl, xl)
        step = e.coeff(simd)
        return int(step) if e.coeff(outer) == 1 and step != 1 and step.is_Integer else None

    def _staged_load(self, ptr: str, idx: str, buf_dtype, step: int) -> KValue:
        """Copy the tile of a transposed input into a local buffer, walking the input along its
        contiguous axis (one pass over a few whole cache lines), and read that in the SIMD loop: no
        gathers of one element per cache line, no cache-set conflicts on power-of-two strides."""
        elem = f"{ptr}[{idx}]"
        key = f"stage:{elem}"
        hit = self.global_cache.get(key)
        if hit is not None:
            return hit
        cdt = compute_dtype(buf_dtype)
        buf = f"ember_stage{len(self.stage)}"
        # float tiles move as whole vectors (ember::transpose_block); other types element by element
        vec = (ptr, idx, step) if buf_dtype == torch.float32 else None
        self.stage.append((buf, ctype(cdt), load_expr(elem, buf_dtype), vec))
        v = self.cse(f"{buf}[{'rl' if self.simd_x else 'xl'}][{'xl' if self.simd_x else 'rl'}]", cdt, "xr")
        self.global_cache[key] = v
        return v

    def _store(self, name: str, index, value: KValue, where: str, mode=None):
        idx, _ = self.index_str(index)
        if mode is None:     # what an atomic add leaves there is not `value`: nothing to forward
            self.stored.setdefault(name, {})[idx] = value
        if name in self.local:
            return None
        ptr = self.args.output(name)
        buf_dtype = self.graph.get_dtype(name)
        if mode == "atomic_add":
            if buf_dtype not in (torch.float32, torch.float64, torch.int32, torch.int64):
                raise NotImplementedError(f"atomic_add into a {buf_dtype} buffer")
            self.atomics = True
            self.emit("#pragma omp atomic", where)
            self.emit(f"{ptr}[{idx}] += {store_expr(value.name, value.dtype, buf_dtype)};", where)
            return None
        self.emit(f"{ptr}[{idx}] = {store_expr(value.name, value.dtype, buf_dtype)};", where)
        return None

    def store_reduction(self, name, index, value):
        return self._store(name, index, value, "post" if self.section.kind == "loop" else "body")

    def index_expr(self, expr, dtype):
        idx, kind = self.index_str(expr)
        if kind == "scalar" and sympy.sympify(expr).is_Integer:
            return self.constant(int(expr), dtype)
        return self.cse(f"static_cast<{ctype(compute_dtype(dtype))}>({idx})", compute_dtype(dtype), kind)

    def indirect_indexing(self, value: KValue, size, check=True):
        size_s = cpp_index(size)
        for s in size_symbols(size):
            self.args.size(s)
        v = self.cse(f"({value} < 0 ? static_cast<int64_t>({value}) + ({size_s}) : static_cast<int64_t>({value}))",
                     torch.int64, "scalar" if value.kind == "const" else value.kind)
        if v.name not in self._tmp_values:
            self._tmp_values[v.name] = v
            if check:
                # an index out of range fails the call (IndexError) instead of touching other memory
                self.checks = True
                self.emit(f"if ((uint64_t){v} >= (uint64_t)({size_s})) "
                          f"{{ __atomic_store_n(&ember_err, 1, __ATOMIC_RELAXED); {v} = 0; }}", self._where[v.name])
        return sympy.Symbol(v.name, integer=True, nonnegative=True)

    # -- reductions ------------------------------------------------------------------------------------

    def _lanes(self, acc: str, ctype_: str, init: str) -> list[str]:
        n = XLANES if self.xlanes else self.lanes
        return [f"{ctype_} {acc}[{n}];", f"for (int ember_l = 0; ember_l < {n}; ++ember_l) {acc}[ember_l] = {init};"]

    def _result(self, name: str, dtype, decl: list[str]) -> KValue:
        """A row result declared by post lines `decl`, visible to every later section."""
        self.section.post.extend(decl)
        v = KValue(name, dtype, "x")
        self.scope[name] = None
        return v

    def _reduce(self, dtype, src_dtype, rtype, value: KValue):
        """Accumulate into lanes in the loop body; combine the lanes after the loop. In x-lanes mode a
        lane is one row, so the lane is the row's result."""
        sec = self.section
        acc = f"acc{next(self.counter)}"
        ln = "xl" if self.xlanes else "rl"
        lane = f"{acc}[{ln}]"
        if rtype == "welford":
            return self._loop_welford(acc, ln, value, dtype)
        if rtype == "online_softmax":
            return self._loop_softmax_stats(acc, ln, value, dtype)
        red = REDUCTIONS[rtype]
        src = value.dtype
        if rtype in ("argmax", "argmin"):
            t = ctype(src)
            better = ">" if rtype == "argmax" else "<"
            ident, index = red.identity(src)
            sec.pre += self._lanes(acc, t, c_literal(ident, src)) + self._lanes(f"{acc}_i", "int64_t", str(index))
            # strict comparison: a later equal value never replaces the first; the first NaN stays
            nan = f" || (v_ != v_ && {lane} == {lane})" if src.is_floating_point else ""
            sec.body.append(f"{{ const {t} v_ = {value}; const bool take_ = (v_ {better} {lane}){nan}; "
                            f"{lane} = take_ ? v_ : {lane}; {acc}_i[{ln}] = take_ ? rindex : {acc}_i[{ln}]; }}")
            if self.xlanes:
                return self._result(f"{acc}_i[xl]", torch.int64, [])
            mx = "true" if rtype == "argmax" else "false"
            return self._result(f"{acc}_ri", torch.int64, _tree(
                f"if (ember::arg_better<{mx}, {t}>({{0}}[{{hi}}], {{0}}_i[{{hi}}], {{0}}[{{lo}}], {{0}}_i[{{lo}}])) "
                "{{ {0}[{lo}] = {0}[{hi}]; {0}_i[{lo}] = {0}_i[{hi}]; }}", acc, self.lanes)
                + [f"int64_t {acc}_ri = {acc}_i[0];"])
        rdt = red.accumulator_dtype(dtype, src)
        t = ctype(rdt)
        sec.pre += self._lanes(acc, t, c_literal(red.identity(rdt), rdt))
        v = f"static_cast<{t}>({value})" if rdt != torch.bool else f"({value} != 0)"
        combine = getattr(CppExprs(rdt), red.combine)
        sec.body.append(f"{lane} = {combine(lane, v)};")
        if self.xlanes:
            r = self._result(f"{acc}[xl]", rdt, [])
        else:
            r = self._result(f"{acc}_r", rdt, [f"{t} {acc}_r = ember::reduce_lanes<{self.lanes}, {t}>({acc}, "
                                               f"[](auto a_, auto b_) {{ return {combine('a_', 'b_')}; }});"])
        if rdt == red.result_dtype(dtype):
            return r
        return self.cse(f"static_cast<{ctype(dtype)}>({r})", dtype, "x", where="post")

    def _loop_welford(self, acc, ln, value, dtype):
        """reduction_steps.welford_update in each lane; every lane active in a chunk has seen the same
        number of values, so the step's reciprocal is computed once per chunk, not a vector division per
        element. The lanes merge after the loop (ember::welford_lanes)."""
        sec, t = self.section, ctype(dtype)
        state = [f"{acc}_m", f"{acc}_m2", f"{acc}_w"]
        for n, ident in zip(state, REDUCTIONS["welford"].identity(dtype)):
            sec.pre += self._lanes(n, t, c_literal(ident, dtype))
        seen = f"r0 / {self.lanes}" if not self.xlanes else "rindex"
        chunk = CppExprs(dtype, acc)
        inv = welford_reciprocal(chunk, f"static_cast<{t}>({seen})")
        sec.chunk += chunk.lines
        b = CppExprs(dtype, acc)
        v = b.let(f"static_cast<{t}>({value})", "v")
        new = welford_update(b, *(f"{n}[{ln}]" for n in state), v, inv)
        sec.body.append(_block(b.lines + [f"{n}[{ln}] = {e};" for n, e in zip(state, new)]))
        if self.xlanes:
            return tuple(self._result(f"{n}[xl]", dtype, []) for n in state)
        sec.post += [f"{t} {acc}_rm, {acc}_rm2, {acc}_rw;",
                     f"ember::welford_lanes<{self.lanes}, {t}>({acc}_m, {acc}_m2, {acc}_w, "
                     f"{acc}_rm, {acc}_rm2, {acc}_rw);"]
        return tuple(self._result(f"{acc}_r{p}", dtype, []) for p in ("m", "m2", "w"))

    def _loop_softmax_stats(self, acc, ln, value, dtype):
        """(max, sum of exp(v - max)) in one pass, the per-lane strategy
        (reduction_steps.softmax_stats_lane_step): a running max per lane and a sum rescaled when it grows,
        one exp per element. The lanes merge after the loop (ember::softmax_stats_lanes)."""
        sec, t = self.section, ctype(dtype)
        m0, s0 = REDUCTIONS["online_softmax"].identity(dtype)
        sec.pre += self._lanes(f"{acc}_m", t, c_literal(m0, dtype)) + self._lanes(f"{acc}_s", t, c_literal(s0, dtype))
        m, s_ = f"{acc}_m[{ln}]", f"{acc}_s[{ln}]"
        b = CppExprs(dtype, acc)
        v = b.let(f"static_cast<{t}>({value})", "v")
        m_n, s_n = softmax_stats_lane_step(b, m, s_, v)
        sec.body.append(_block(b.lines + [f"{s_} = {s_n};", f"{m} = {m_n};"]))
        if self.xlanes:
            return tuple(self._result(e, dtype, []) for e in softmax_stats_finish(b, f"{acc}_m[xl]", f"{acc}_s[xl]"))
        sec.post += [f"{t} {acc}_rm, {acc}_rs;",
                     f"ember::softmax_stats_lanes<{self.lanes}, {t}>({acc}_m, {acc}_s, {acc}_rm, {acc}_rs);"]
        return self._result(f"{acc}_rm", dtype, []), self._result(f"{acc}_rs", dtype, [])

    # -- scans ---------------------------------------------------------------------------------------------

    def scan(self, dtype, combine, value: KValue):
        """The row's running value, carried by the serial loop over the steps (in x-lanes mode, one per
        row of the block: the SIMD loop runs across rows)."""
        if not self.has_rdim:
            return value           # a scan of one step is its value
        sec = self.section
        t = ctype(value.dtype)
        acc = f"acc{next(self.counter)}"
        ident = c_literal(SCANS[combine].identity(value.dtype), value.dtype)
        if self.xlanes:
            sec.pre += self._lanes(acc, t, ident)
            acc += "[xl]"
        else:
            sec.pre.append(f"{t} {acc} = {ident};")
        sec.body.append(f"{acc} = {_SCAN_STEP[combine].format(acc, value)};")
        self.scope[acc] = sec.id
        return KValue(acc, value.dtype, "xr")

    # -- source ----------------------------------------------------------------------------------------

    def params(self) -> list[str]:
        out = []
        for p, buf in self.args.call_order():
            t = storage_type(self.graph.get_dtype(buf))
            out.append(f"const {t}* {p}" if p.startswith("in_ptr") else f"{t}* {p}")
        out.append("int64_t xnumel")
        if self.has_rdim:
            out.append("int64_t rnumel")
        out += [f"int64_t {s}" for s in self.args.sizes.values()]
        return out + ["int ember_threads"]

    def source(self, exported: bool = True) -> str:
        """The kernel as a C++ function: `extern "C"` for the library's loader, or `static` where another
        generated function calls it (cpp/backend.py's kernel of independent parts)."""
        params = ", ".join(self.params())
        lines = []
        if self.tiled:
            # the threaded loop nest in a function of its own: in the same function, GCC 12's code
            # layout slows the single-threaded nest (docs/performance.md, "CPU")
            args = ", ".join(p.split()[-1] for p in self.params())
            serial, threaded = self._tiled_loop()
            lines += [f"static __attribute__((noinline)) int {self.name}_threaded({params}) {{",
                      "  int ember_err = 0;"] + self.size_names.definitions() + threaded + ["  return ember_err;", "}"]
        linkage = 'extern "C"' if exported else "static"
        lines += [f"{linkage} int {self.name}({params}) {{", "  int ember_err = 0;"] + self.size_names.definitions()
        if not self.has_rdim:
            lines += self._pointwise_loop()
        elif self.tiled:
            lines += [f"  if (ember_threads > 1 && xnumel * rnumel >= {PARALLEL_MIN_WORK}) "
                      f"return {self.name}_threaded({args});"] + serial
        elif self.rows is not None:
            lines += self._rows_pointwise_loop()
        elif self.xlanes:
            lines += self._xlanes_loop()
        else:
            lines += self._rows_loop()
        lines += ["  return ember_err;", "}"]
        return "\n".join(lines) + "\n"

    @property
    def _simd(self) -> str:
        # a bounds check writes the shared error flag, and an atomic add may hit one element from two
        # lanes: neither is a loop for `omp simd`
        return "" if self.checks or self.atomics else "#pragma omp simd"

    def _parallel(self, cond: str) -> str:
        return (f"  #pragma omp parallel for num_threads(ember_threads) schedule(static) "
                f"if(ember_threads > 1 && {cond})")

    def _pointwise_loop(self) -> list[str]:
        sec = self.sections[0] if self.sections else Section("flat", 0)
        # values of no element (loads at fixed positions and what they compute) come first, once: an empty
        # kernel returns before reading them
        hoisted = ["  if (xnumel <= 0) return ember_err;"] + ["  " + ln for ln in sec.pre] if sec.pre else []
        lines = hoisted + [self._parallel(f"xnumel >= {PARALLEL_MIN_WORK}"),
                 f"  for (int64_t x0 = 0; x0 < xnumel; x0 += {XCHUNK}) {{",
                 f"    const int64_t xn = ember::imin({XCHUNK}, xnumel - x0);",
                 f"    {self._simd}",
                 "    for (int64_t xl = 0; xl < xn; ++xl) {",
                 "      const int64_t xindex = x0 + xl;"]
        lines += ["      " + ln for ln in sec.body + sec.post]
        return lines + ["    }", "  }"]

    def _rows_pointwise_loop(self) -> list[str]:
        """Rows of a pointwise kernel: a thread's unit of work is a block of rows, or a chunk of one
        long row (XCHUNK elements either way); per-row values are computed once, before the SIMD loop."""
        sec = self.sections[0] if self.sections else Section("flat", 0)
        hints = getattr(self.graph, "symbol_hints", {})
        try:
            block = max(1, XCHUNK // int(sympy.sympify(self.R).subs(hints)))
        except (TypeError, ValueError):
            block = 1
        inner = ["        " + ln for ln in sec.body + sec.post] + ["      }", "    }", "  }"]
        R = sympy.sympify(self.R)
        if R.is_Integer and int(R) <= XCHUNK:
            # a static row that fits one chunk: a constant trip count, straight vector code
            return [f"  const int64_t ember_nt = (xnumel + {block} - 1) / {block};",
                    self._parallel(f"xnumel * rnumel >= {PARALLEL_MIN_WORK}"),
                    "  for (int64_t ember_t = 0; ember_t < ember_nt; ++ember_t) {",
                    f"    const int64_t x0 = ember_t * {block}, xe = ember::imin(x0 + {block}, xnumel);",
                    "    for (int64_t xindex = x0; xindex < xe; ++xindex) {"] + \
                ["      " + ln for ln in sec.pre] + \
                [f"      {self._simd}", f"      for (int64_t rindex = 0; rindex < {int(R)}; ++rindex) {{"] + inner
        return [f"  const int64_t ember_rc = (rnumel + {XCHUNK} - 1) / {XCHUNK};",
                f"  const int64_t ember_nt = ((xnumel + {block} - 1) / {block}) * ember_rc;",
                self._parallel(f"xnumel * rnumel >= {PARALLEL_MIN_WORK}"),
                "  for (int64_t ember_t = 0; ember_t < ember_nt; ++ember_t) {",
                f"    const int64_t x0 = (ember_t / ember_rc) * {block}, r0 = (ember_t % ember_rc) * {XCHUNK};",
                f"    const int64_t xe = ember::imin(x0 + {block}, xnumel), rn = ember::imin({XCHUNK}, rnumel - r0);",
                "    for (int64_t xindex = x0; xindex < xe; ++xindex) {"] + \
            ["      " + ln for ln in sec.pre] + \
            [f"      {self._simd}",
             "      for (int64_t rl = 0; rl < rn; ++rl) {",
             "        const int64_t rindex = r0 + rl;"] + inner

    def _tiled_loop(self) -> tuple[list[str], list[str]]:
        """A transpose-like pointwise kernel: tiles of TILE_OUTER x TILE_SIMD elements, so that accesses
        contiguous along x and those contiguous along r both stay within a few cache lines and pages per
        tile (a 1-D loop touches a new line, often a new page, per element on one side). The inner loop
        over tiles follows the SIMD axis, the one the stores are contiguous along, so the output and the
        inputs read along it stream row by row; threads split the outer one. A full tile has constant
        trip counts and stages float inputs with in-register block transposes; edge tiles take the
        general loops. Returns the loop nest twice, (serial, threaded): outlined into an OpenMP region,
        this one runs slower single-threaded (GCC 12's code for the outlined body; docs/performance.md, "CPU"),
        so one thread runs a plain copy."""
        TILE_X, TILE_R = (TILE_SIMD, TILE_OUTER) if self.simd_x else (TILE_OUTER, TILE_SIMD)
        a, b = ("ember_tr", "ember_tx") if self.simd_x else ("ember_tx", "ember_tr")
        outer, simd = ((TILE_R, TILE_X) if self.simd_x else (TILE_X, TILE_R))
        # static sizes as literals: tile counts the compiler sees, and no edge tiles when the tiles divide
        X, R = sympy.sympify(self.X), sympy.sympify(self.R)
        xnumel, rnumel = (str(int(X)) if X.is_Integer else "xnumel"), (str(int(R)) if R.is_Integer else "rnumel")
        edges = not (X.is_Integer and R.is_Integer and int(X) % TILE_X == 0 and int(R) % TILE_R == 0)
        full = self._stage_lines(str(TILE_X), str(TILE_R), full=True) + self._tile_body(str(TILE_X), str(TILE_R))
        nest = [f"  for (int64_t ember_a = 0; ember_a < {a}; ++ember_a) {{",
                f"  for (int64_t ember_b = 0; ember_b < {b}; ++ember_b) {{",
                f"    const int64_t x0 = {'ember_b' if self.simd_x else 'ember_a'} * {TILE_X}, "
                f"r0 = {'ember_a' if self.simd_x else 'ember_b'} * {TILE_R};"] + \
            [f"    alignas(64) {t} {buf}[{outer}][{simd}];" for buf, t, _, _ in self.stage]
        if edges:
            nest += [f"    const int64_t xn = ember::imin({TILE_X}, {xnumel} - x0), "
                     f"rn = ember::imin({TILE_R}, {rnumel} - r0);",
                     f"    if (xn == {TILE_X} && rn == {TILE_R}) {{"] + ["  " + ln for ln in full] + \
                ["    } else {"] + \
                ["  " + ln for ln in self._stage_lines("xn", "rn", full=False) + self._tile_body("xn", "rn")] + \
                ["    }"]
        else:
            nest += full
        nest += ["  }", "  }"]
        setup = [f"  const int64_t ember_tx = ({xnumel} + {TILE_X} - 1) / {TILE_X}, "
                 f"ember_tr = ({rnumel} + {TILE_R} - 1) / {TILE_R};"]
        return setup + nest, setup + ["  #pragma omp parallel for num_threads(ember_threads) schedule(static)"] + nest

    def _tile_body(self, xn: str, rn: str) -> list[str]:
        sec = self.sections[0] if self.sections else Section("flat", 0)
        loops = ([f"    for (int64_t rl = 0; rl < {rn}; ++rl) {{",
                  "      const int64_t rindex = r0 + rl;",
                  f"      {self._simd}",
                  f"      for (int64_t xl = 0; xl < {xn}; ++xl) {{",
                  "        const int64_t xindex = x0 + xl;"] if self.simd_x else
                 [f"    for (int64_t xl = 0; xl < {xn}; ++xl) {{",
                  "      const int64_t xindex = x0 + xl;",
                  f"      {self._simd}",
                  f"      for (int64_t rl = 0; rl < {rn}; ++rl) {{",
                  "        const int64_t rindex = r0 + rl;"])
        return loops + ["        " + ln for ln in sec.pre + sec.body + sec.post] + ["      }", "    }"]

    def _stage_lines(self, xn: str, rn: str, full: bool) -> list[str]:
        if not self.stage:
            return []
        outer, simd = (("rl", rn), ("xl", xn)) if self.simd_x else (("xl", xn), ("rl", rn))
        lines = []
        scalar = [(buf, expr) for buf, _, expr, vec in self.stage if not (full and vec)]
        for buf, _, _, vec in self.stage:
            if full and vec:
                # src rows run along the SIMD axis (stride `step`), contiguous along the other
                ptr, idx, step = vec
                lines += [f"    for (int64_t xl = 0; xl < {xn}; xl += EMBER_TW)",
                          f"      for (int64_t rl = 0; rl < {rn}; rl += EMBER_TW) {{",
                          "        const int64_t xindex = x0 + xl, rindex = r0 + rl;",
                          f"        ember::transpose_block(&{ptr}[{idx}], {step}, &{buf}[{outer[0]}][{simd[0]}], "
                          f"{TILE_SIMD});",
                          "      }"]
        if scalar:
            # the loop along the inputs' contiguous axis (the kernel's non-SIMD one) innermost
            lines += [f"    for (int64_t {simd[0]} = 0; {simd[0]} < {simd[1]}; ++{simd[0]}) {{",
                      f"      for (int64_t {outer[0]} = 0; {outer[0]} < {outer[1]}; ++{outer[0]}) {{",
                      "        const int64_t xindex = x0 + xl, rindex = r0 + rl;"]
            lines += [f"        {buf}[{outer[0]}][{simd[0]}] = {expr};" for buf, expr in scalar]
            lines += ["      }", "    }"]
        return lines

    def _rows_loop(self) -> list[str]:
        cond = f"xnumel > 1 && xnumel * rnumel >= {PARALLEL_MIN_WORK}"
        if self.row_bufs:
            # a row buffer per thread, allocated once per call, not per row
            lines = [f"  #pragma omp parallel num_threads(ember_threads) if(ember_threads > 1 && {cond})", "  {"]
            lines += [f"  {t}* {b} = static_cast<{t}*>(std::malloc(sizeof({t}) * rnumel));"
                      for b, t in self.row_bufs.values()]
            lines += ["  #pragma omp for schedule(static)"]
        else:
            lines = [self._parallel(cond)]
        lines += ["  for (int64_t xindex = 0; xindex < xnumel; ++xindex) {"]
        R = sympy.sympify(self.R)
        rnumel = str(int(R)) if R.is_Integer else "rnumel"    # a static row: trip counts the compiler sees
        for sec in self.sections:
            body = list(sec.pre)
            if sec.kind == "loop" and self.has_scan:
                # each step needs the one before: one serial loop, no SIMD lanes
                body += [f"for (int64_t rindex = 0; rindex < {rnumel}; ++rindex) {{"] + \
                    ["  " + ln for ln in sec.body] + ["}"]
            elif sec.kind == "loop":
                # whole chunks with a constant trip count (straight vector code), then one partial chunk
                inner = ["    const int64_t rindex = r0 + rl;"] + ["    " + ln for ln in sec.body] + ["  }"]
                chunk = ["  " + ln for ln in sec.chunk]
                body += ["{", "int64_t r0 = 0;",
                         f"for (; r0 + {self.lanes} <= {rnumel}; r0 += {self.lanes}) {{"] + chunk + [
                         f"  {self._simd}", f"  for (int64_t rl = 0; rl < {self.lanes}; ++rl) {{"] + inner + ["}"]
                if not (R.is_Integer and int(R) % self.lanes == 0):
                    body += [f"if (r0 < {rnumel}) {{", f"  const int64_t rn = {rnumel} - r0;"] + chunk + [
                             f"  {self._simd}", "  for (int64_t rl = 0; rl < rn; ++rl) {"] + inner + ["}"]
                body += ["}"]
            else:
                body += sec.body
            lines += ["    " + ln for ln in body + sec.post]
        lines += ["  }"]
        if self.row_bufs:
            lines += [f"  std::free({b});" for b, _ in self.row_bufs.values()] + ["  }"]
        return lines

    def _over_rows(self, body: list[str], count: str = "xn") -> list[str]:
        if not body:
            return []
        return [self._simd, f"for (int64_t xl = 0; xl < {count}; ++xl) {{", "  const int64_t xindex = x0 + xl;"] + \
            ["  " + ln for ln in body] + ["}"]

    def _xlanes_loop(self) -> list[str]:
        lines = [self._parallel(f"xnumel > {XLANES} && xnumel * rnumel >= {PARALLEL_MIN_WORK}"),
                 f"  for (int64_t x0 = 0; x0 < xnumel; x0 += {XLANES}) {{",
                 f"    const int64_t xn = ember::imin({XLANES}, xnumel - x0);"]
        body = list(self.decls)
        for sec in self.sections:
            body += sec.pre
            if sec.kind == "loop":
                # a full block gets a constant trip count: straight vector code, no remainder loop
                for cond, count in ((f"if (xn == {XLANES}) {{", str(XLANES)), ("} else {", "xn")):
                    body += [cond, "  for (int64_t rindex = 0; rindex < rnumel; ++rindex) {"]
                    body += ["    " + ln for ln in sec.chunk]
                    body += ["    " + ln for ln in self._over_rows(sec.body, count)] + ["  }"]
                body += ["}"] + self._over_rows(sec.post)
            else:
                body += self._over_rows(sec.body + sec.post)
        return lines + ["    " + ln for ln in body] + ["  }"]
