"""A fused group holding a GEMM template (ir/template.py) -> one Triton kernel: a tiled matrix product with
its pointwise consumers computed on the output tile before anything is stored.

The kernel is a TritonKernel whose one section starts with the template's main loop. The grid is
persistent: at most one program per SM, each walking the output tiles (BLOCK_M x BLOCK_N, of every batch
entry for bmm) `tl.num_programs(0)` apart, in a loop Triton flattens with the K loop inside it, so one tile's
epilogue overlaps the next tile's first loads. For each tile the program accumulates the product in float32
over K with `tl.dot`, and then defines `xindex` (the flat index of each tile element in the product's
row-major order, a [BLOCK_M, BLOCK_N] block) and `xmask` (elements inside the product). From there on the
fused nodes' store bodies run exactly as in a pointwise kernel, inside the tile loop: their indices are the
scheduler's, in terms of the flat `xindex` (fusion checked that every access of the product is at the
element the template writes), and their loads of the product are forwarded the tile's value. The product is
stored only where something outside the kernel reads it.

Whether a product is a template at all is decided before lowering (gemm_templates="auto":
product_choice.py times the template's main loop against the library call).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ... import metrics
from ...ir.ops import handler
from ...ir.template import is_template, operand_base
from ...runtime import compile_pool
from ...runtime.template_choice import TemplateTuning
from ...schedule.nodes import kernel_index_vars
from ..generate import GeneratedKernel, generate_kernel
from ..kernel import KValue
from ..wrapper.lines import CallKernel, DefineKernel, KernelSignature, Name
from .heuristics import next_pow2
from .kernel import TritonKernel
from .spelling import triton_type

# dtypes the template multiplies (with a float32 accumulator)
TEMPLATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Candidate tiles on a GPU: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), best guess first. Block sizes
# are multiples of 16 (tl.dot's smallest tile on sm80 and sm90); the deep-K, many-stage tiles fit the 228 KB
# of shared memory of an H100 for 16-bit operands, float32 takes half the K depth. On the GEMM anchor's
# products (H100, experiments/persistent_gemm_probe.py) 128x256 with 8 warps was fastest on most, 128x128
# with 4 warps and 4 stages on a narrow one (N=768, K=3072).
_GPU_TILES_16BIT = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 256, 64, 8, 4),
                    (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4), (32, 64, 64, 4, 5)]
_GPU_TILES_32BIT = [(128, 128, 32, 8, 3), (64, 128, 32, 4, 4), (128, 64, 32, 4, 4), (64, 64, 32, 4, 4),
                    (32, 64, 32, 4, 5)]
GROUP_M = 8           # programs along M that walk N together, so their B tiles stay in L2

# A row-vector product (M = 1: a decoding step's linear layers) is bound by reading B once. Its programs each
# own BLOCK_N columns of the output, as many programs as that makes (not one per SM), and sum the products of
# x with BLOCK_N rows of B^T along K on CUDA cores: (BLOCK_N, BLOCK_K, num_warps, num_stages), best first.
# On an H100 (experiments/skinny_gemm_probe.py --cold, B read from memory), 1-2 stages alike: 4 x 128 with 8
# warps within 3% of the fastest on 1024 x 1024, 1024 x 2816, 512 x 4096 and 4096 x 11008 (N x K); 8 x 128
# the fastest of the wider blocks on 1536 x 1024 up to 50257 x 768; 2 x 512 with 2 warps the fastest on three
# of the first four. The first call times them on its arguments.
_GPU_ROW_TILES = [(4, 128, 8, 1), (8, 128, 8, 1), (2, 512, 2, 1), (16, 128, 8, 1)]
_INTERPRETED_ROW_TILE = (32, 64, 1, 1)


def is_row_vector(sizes: tuple, batched: bool) -> bool:
    """Whether a product of (batch, M, N, K) is one row times a matrix (not a bmm), which the row-vector loop
    computes."""
    return not batched and sizes[1] == 1


def template_configs(sizes: tuple, dtype: torch.dtype, interpreted: bool, batched: bool = False) -> list[dict]:
    """Launch metas for a product of (batch, M, N, K), best guess first. Tiles shrink to the problem (no
    dimension past the next power of two of its size, none below 16), duplicates dropped. The interpreter
    gets one tile, as large as the product allows: it runs each program's operations one by one, so fewer
    programs run faster."""
    _, m, n, k = sizes
    if is_row_vector(sizes, batched):
        tiles = [_INTERPRETED_ROW_TILE] if interpreted else _GPU_ROW_TILES
        out = []
        for bn, bk, warps, stages in tiles:
            cfg = {"BLOCK_M": 1, "BLOCK_N": min(bn, next_pow2(n)), "BLOCK_K": min(bk, max(16, next_pow2(k))),
                   "GROUP_M": 1, "num_warps": warps, "num_stages": stages}
            if cfg not in out:
                out.append(cfg)
        return out
    if interpreted:
        tiles = [(64, 64, 32, 1, 1)]
    else:
        tiles = _GPU_TILES_32BIT if dtype == torch.float32 else _GPU_TILES_16BIT
    out = []
    for bm, bn, bk, warps, stages in tiles:
        cfg = {"BLOCK_M": _fit(bm, m), "BLOCK_N": _fit(bn, n), "BLOCK_K": _fit(bk, k), "GROUP_M": GROUP_M,
               "num_warps": warps, "num_stages": stages}
        if cfg["BLOCK_M"] * cfg["BLOCK_N"] <= 64 * 64:
            cfg["num_warps"] = min(warps, 4)
        if cfg not in out:
            out.append(cfg)
    return out


def _fit(block: int, size: int) -> int:
    return max(16, min(block, next_pow2(max(size, 1))))


class TemplateKernel(TritonKernel):
    """The template's main loop, then the fused group's other nodes on its output tile."""
    # its call passes pointers only: a random op's seed position in an epilogue stays a literal
    element_arguments = False

    def __init__(self, name, group, graph, local, even_k: bool, interpreted: bool, materialize=frozenset()):
        super().__init__(name, group, graph, local, materialize)
        self.even_k, self.interpreted = even_k, interpreted
        self.template = next(n for n in self.nodes if is_template(n.buf))
        self.product = self.template.buf.data

    def shape(self, kind: str) -> str:
        return "[BLOCK_M, BLOCK_N]" if kind == "x" else super().shape(kind)

    def generate(self):
        with handler(self):
            self._new_section("flat")
            self._main_loop()
            for node in self.nodes:
                if node is not self.template:
                    ivals, rvals = kernel_index_vars(node, self.group)
                    node.buf.store_body(ivals, rvals)
        return self

    def _operand(self, view) -> tuple:
        """(pointer, offset, strides of the (batch, row, col) dims, the Triton type its tile is cast to or None)
        of a stored operand: one stored in another dtype than the product multiplies is cast as it is loaded."""
        base, offset = operand_base(view)
        layout = view.layout
        strides = [int(s) if int(n) != 1 else 0 for s, n in zip(layout.stride, layout.size)]
        cast = triton_type(self.product.operand_dtype) if view.get_dtype() != self.product.operand_dtype else None
        return self.args.input(base.storage_name()), offset, ([0] + strides if len(strides) == 2 else strides), cast

    def _main_loop(self):
        p = self.product
        self.main = main_loop_lines(p.sizes(), p.batched, p.operand_dtype, self._operand(p.a), self._operand(p.b),
                                    self.use_int64, self.even_k, self.interpreted, p.tf32)
        for line in self.main.tile:
            self.emit(line)
        # the product's value as the buffer holds it: a 16-bit product is rounded, as eager's is (a product
        # stored in float32, a split of K's partial, is not)
        acc = KValue("acc", torch.float32, "x")
        if p.dtype != torch.float32:
            acc = self.cse(f"acc.to({triton_type(p.dtype)}).to(tl.float32)", torch.float32, "x")
        buf = self.template.buf
        ivals, _ = kernel_index_vars(self.template, self.group)
        index = buf.layout.index(ivals) - buf.layout.offset
        if self.template.name in self.local:
            idx_s, _ = self.index_str(index)
            self.stored.setdefault(self.template.name, {})[idx_s] = acc
        else:
            self._store(self.template.name, index, acc, "body")

    def signature(self) -> list[str]:
        return [p for p, _ in self.args.call_order()]

    def source(self) -> str:
        consts = ["BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr", "GROUP_M: tl.constexpr"]
        lines = ["@triton.jit", f"def {self.name}({', '.join(self.signature() + consts)}):"]
        sec = self.sections[0]
        # the tile's lines come first in the body; the fused epilogue follows them inside the tile loop
        lines += ["    " + ln for ln in self.main.around(sec.pre + sec.body + sec.post)]
        return "\n".join(lines) + "\n"


@dataclasses.dataclass
class MainLoop:
    """The template's main loop as lines: `setup` runs once per program, `tile` once per output tile (its
    product `acc`, `xindex`, `xmask`), inside the loop over the program's tiles (`tile_loop`; None: a
    program computes one tile)."""
    setup: list
    tile_loop: Optional[str]
    tile: list

    def around(self, tile_body: list) -> list:
        """The kernel body: the setup, then the tile loop over `tile_body` (the tile's lines and what follows
        them)."""
        if self.tile_loop is None:
            return self.setup + tile_body
        return self.setup + [self.tile_loop] + ["    " + ln for ln in tile_body]


def main_loop_lines(sizes: tuple, batched: bool, dtype: torch.dtype, a: tuple, b: tuple, int64: bool,
                    even_k: bool, interpreted: bool, tf32: bool = False) -> MainLoop:
    """The template's main loop: for each of the program's tiles, the float32 tile `acc` of the product,
    then `xindex` and `xmask` (the tile's flat positions in the row-major product, and which are inside it).
    `a` and `b` are each operand's (pointer name, offset, (batch, row, col) strides[, the Triton type its tile
    is cast to as it is loaded, or None]); float32 operands multiply in TF32 where `tf32`."""
    if is_row_vector(sizes, batched):
        return row_loop_lines(sizes, dtype, a, b, int64, even_k)
    batch, M, N, K = sizes
    a_ptr, a_off, (sab, sam, sak), *a_cast = a
    b_ptr, b_off, (sbb, sbk, sbn), *b_cast = b
    idx = ".to(tl.int64)" if int64 else ""
    precision = ""
    if dtype == torch.float32:
        precision = f", input_precision=\"{'tf32' if tf32 else 'ieee'}\""
    setup = [
        f"# {'bmm' if batched else 'mm'}: [{batch}] x [{M}, {K}] @ [{K}, {N}], {dtype}, float32 accumulator",
        f"num_pid_m = {_cdiv_src(M, 'BLOCK_M')}",
        f"num_pid_n = {_cdiv_src(N, 'BLOCK_N')}",
        "tiles_per_batch = num_pid_m * num_pid_n",
        # GROUP_M rows of tiles walk the columns together: their B tiles stay in L2
        "pids_in_group = GROUP_M * num_pid_n",
    ]
    # flatten: Triton pipelines the K loop across tiles, so a tile's epilogue overlaps the next one's loads
    tile_loop = f"for tile in tl.range(tl.program_id(0), {batch} * tiles_per_batch, tl.num_programs(0), flatten=True):"
    lines = [
        f"tb = (tile // tiles_per_batch){idx}" if batched else "tb = 0",
        "pid = tile % tiles_per_batch",
        "first_pid_m = (pid // pids_in_group) * GROUP_M",
        "group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)",
        "pid_m = first_pid_m + (pid % pids_in_group) % group_rows",
        "pid_n = (pid % pids_in_group) // group_rows",
        f"rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){idx}",
        f"rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){idx}",
        "rk = tl.arange(0, BLOCK_K)",
        # rows and columns past the edge read row 0 / column 0 (in bounds); their results are masked
        f"ram = rm % {M}",
        f"rbn = rn % {N}",
        f"a_ptrs = {a_ptr} + ({a_off} + tb * {sab} + ram[:, None] * {sam} + rk[None, :] * {sak})",
        f"b_ptrs = {b_ptr} + ({b_off} + tb * {sbb} + rk[:, None] * {sbk} + rbn[None, :] * {sbn})",
        "acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)",
        f"for k in range(0, {K}, BLOCK_K):",
    ]
    if even_k:       # every config's BLOCK_K divides K: no masks in the main loop
        body = ["a = tl.load(a_ptrs)", "b = tl.load(b_ptrs)"]
    else:
        body = [f"a = tl.load(a_ptrs, mask=rk[None, :] < {K} - k, other=0.0)",
                f"b = tl.load(b_ptrs, mask=rk[:, None] < {K} - k, other=0.0)"]
    # a prologue: an operand stored in another dtype (a float32 weight under autocast) is cast on its tile
    body += [f"{name} = {name}.to({cast[0]})" for name, cast in (("a", a_cast), ("b", b_cast)) if cast and cast[0]]
    if interpreted and dtype == torch.bfloat16:
        # Triton's interpreter multiplies bfloat16 blocks wrongly (values off by 1e10); their products are
        # exact in float32, so the interpreter multiplies them there
        body += ["a = a.to(tl.float32)", "b = b.to(tl.float32)"]
        precision = ", input_precision=\"ieee\""
    body += [f"acc = tl.dot(a, b, acc{precision})",
             f"a_ptrs += BLOCK_K * {sak}",
             f"b_ptrs += BLOCK_K * {sbk}"]
    lines += ["    " + ln for ln in body]
    lines += [f"xindex = tb * {M * N} + rm[:, None] * {N} + rn[None, :]",
              f"xmask = (rm < {M})[:, None] & (rn < {N})[None, :]"]
    return MainLoop(setup, tile_loop, lines)


def row_loop_lines(sizes: tuple, dtype: torch.dtype, a: tuple, b: tuple, int64: bool, even_k: bool) -> MainLoop:
    """The main loop of a row-vector product ([1, K] @ [K, N]): the program's BLOCK_N columns, each the sum
    along K of x times a column of B, accumulated in float32 as a [BLOCK_N, BLOCK_K] block and summed once
    at the end; `acc` is then the [1, BLOCK_N] tile. B's columns are read along K, contiguous for a linear
    layer's transposed weight."""
    _, _, N, K = sizes
    a_ptr, a_off, (_, _, sak), *a_cast = a
    b_ptr, b_off, (_, sbk, sbn), *b_cast = b
    # an operand stored in another dtype is rounded to the product's first (a prologue)
    a_to, b_to = (f".to({cast[0]})" if cast and cast[0] else "" for cast in (a_cast, b_cast))
    idx = ".to(tl.int64)" if int64 else ""
    setup = [
        f"# mv: [1, {K}] @ [{K}, {N}], {dtype}, float32 accumulator, BLOCK_N columns per program",
        f"rn = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)){idx}",
        f"rk = tl.arange(0, BLOCK_K){idx}",
        # columns past the edge read column 0 (in bounds); their results are masked
        f"rbn = rn % {N}",
        f"a_ptrs = {a_ptr} + ({a_off} + rk * {sak})",
        f"b_ptrs = {b_ptr} + ({b_off} + rbn[:, None] * {sbn} + rk[None, :] * {sbk})",
        "part = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)",
        f"for k in range(0, {K}, BLOCK_K):",
    ]
    if even_k:
        body = [f"a = tl.load(a_ptrs){a_to}.to(tl.float32)", f"b = tl.load(b_ptrs){b_to}.to(tl.float32)"]
    else:
        body = [f"a = tl.load(a_ptrs, mask=rk < {K} - k, other=0.0){a_to}.to(tl.float32)",
                f"b = tl.load(b_ptrs, mask=(rk < {K} - k)[None, :], other=0.0){b_to}.to(tl.float32)"]
    body += ["part += b * a[None, :]", f"a_ptrs += BLOCK_K * {sak}", f"b_ptrs += BLOCK_K * {sbk}"]
    setup += ["    " + ln for ln in body]
    tile = ["acc = tl.sum(part, 1)[None, :]",
            "rm = tl.arange(0, BLOCK_M)",
            f"xindex = rm[:, None] * {N} + rn[None, :]",
            f"xmask = (rm < 1)[:, None] & (rn < {N})[None, :]"]
    return MainLoop(setup, None, tile)


def _cdiv_src(n: int, block: str) -> str:
    return f"({n} + {block} - 1) // {block}"


def generate_template(backend, name: str, group, graph, local: set) -> GeneratedKernel:
    """A template group's kernel: its DefineKernel (with a TemplateTuning the launcher chooses by) and call."""
    template = next(n for n in group.nodes if is_template(n.buf))
    sizes, batched = template.buf.data.sizes(), template.buf.data.batched
    if template.buf.data.launch is not None:       # chosen by timing before lowering (gemm_templates="auto")
        configs = [template.buf.data.launch]
    else:
        configs = template_configs(sizes, template.buf.data.operand_dtype, backend.interpreted, batched)
        if not backend.tunes:
            configs = configs[:1]
    even_k = all(sizes[3] % cfg["BLOCK_K"] == 0 for cfg in configs)
    k = generate_kernel(lambda materialize: TemplateKernel(name, group, graph, local, even_k,
                                                                        backend.interpreted, materialize))
    ptrs = k.args.call_order()
    args = [Name(buf) for _, buf in ptrs]
    written, read_back = k.args.written_positions()
    source = k.source()
    tuning = TemplateTuning(configs, sizes, written, persistent=not is_row_vector(sizes, batched),
                            read_back=read_back)
    warm = None
    if backend.precompiles:
        compile_pool.start()
        warm = compile_pool.WarmSpec([graph.get_dtype(a) for a in args], configs)
    metrics.template_kernels += 1
    metrics.fused_epilogue_nodes += len(group.nodes) - 1
    define = DefineKernel(name, source, backend, tuning, warm, group.device(), KernelSignature(tuple(k.signature()), ()))
    return GeneratedKernel(define, CallKernel(name, args, None, {}), set(k.args.outputs), source)
