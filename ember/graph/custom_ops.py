"""Ops ember adds to ATen graphs (namespace `ember`, through torch.library): what a post-grad pass rewrites
a pattern into where ember has one kernel for what ATen spells as several ops. Each has an eager
implementation, so a fake-tensor run and an ATen fallback work as for any op, and an ember lowering.

    ember::softmax_stats(x, dim) -> (amax(x, dim, keepdim=True), sum(exp(x - amax), dim, keepdim=True))
        softmax's and log-softmax's row statistics as one reduction that reads each row once (an online
        max and rescaled sum, where a long row is reduced in chunks); lowered in lowering/reductions.py.
    ember::padded_mm(a, b, bias, m, n), ember::chunk_padded_mm(a, a_transposed, b, bias, pad_m, pad_k)
        a product on operands padded to the device's matmul alignment, computed a chunk of rows at a time
        where padding a whole operand or result would add a logits-sized buffer (graph/passes/post_grad.py,
        pad_matmuls).
    ember::chunk_padded_mm_pair(g, b, bt, pad_rows, pad_cols) -> (pad(g) @ b, pad(g).t() @ bt)
        both products that read one large misaligned input (a backward's logits gradient), in one loop over
        its column chunks.
    ember::dropout_bits(bytes, p, device) -> uint8 [bytes]
        the keep flags of a dropout of bytes * 8 elements and probability p, eight to a byte (bit j of byte i:
        element 8i + j kept); a random op (graph/passes/packed_masks.py), lowered in lowering/random.py
        from two Philox draws per byte.
    ember::integer_resize(x, size, scale_factor, mode, align_corners, antialias) -> Tensor
        F.interpolate of an integer image by eager's own kernel, left opaque to AOTAutograd, whose trace
        would otherwise replace it by a float decomposition (graph/passes/integer_resize.py).
"""
from __future__ import annotations

import torch

_lib = torch.library.Library("ember", "DEF")
_lib.define("softmax_stats(Tensor x, int dim) -> (Tensor, Tensor)")


def _softmax_stats(x: torch.Tensor, dim: int):
    m = torch.amax(x, dim, keepdim=True)
    return m, torch.exp(x - m).sum(dim, keepdim=True)


_lib.impl("softmax_stats", _softmax_stats, "CompositeExplicitAutograd")


@torch.library.register_fake("ember::softmax_stats")
def _softmax_stats_fake(x: torch.Tensor, dim: int):
    shape = list(x.shape)
    shape[dim] = 1
    return x.new_empty(shape), x.new_empty(shape)


softmax_stats = torch.ops.ember.softmax_stats.default


_lib.define("padded_mm(Tensor a, Tensor b, Tensor? bias, int m, int n) -> Tensor")
# The rows of one product chunk: enough to keep the GEMM efficient, few enough that the chunk is a small
# part of a logits-sized result (GPT-2's 4096 x 50264 bf16 product is 412 MB; a chunk is 1/8 of it)
PADDED_MM_CHUNK_BYTES = 64 << 20
PADDED_MM_MIN_ROWS = 256


def padded_mm_rows(m: int, padded_cols: int, itemsize: int) -> int:
    rows = PADDED_MM_CHUNK_BYTES // max(1, padded_cols * itemsize)
    return min(m, max(PADDED_MM_MIN_ROWS, rows // 64 * 64))


def _padded_mm(a: torch.Tensor, b: torch.Tensor, bias, m: int, n: int):
    from ..runtime.row_copy import copy_rows
    out = a.new_empty((m, n))
    rows = padded_mm_rows(m, b.shape[1], a.element_size())
    chunk = a.new_empty((rows, b.shape[1]))
    for r in range(0, m, rows):
        c = min(rows, m - r)
        if bias is None:
            torch.mm(a[r:r + c], b, out=chunk[:c])
        else:
            torch.addmm(bias, a[r:r + c], b, out=chunk[:c])
        copy_rows(out[r:r + c], chunk[:c, :n])
    return out


_lib.impl("padded_mm", _padded_mm, "CompositeExplicitAutograd")


@torch.library.register_fake("ember::padded_mm")
def _padded_mm_fake(a, b, bias, m, n):
    return a.new_empty((m, n))


padded_mm = torch.ops.ember.padded_mm.default


_lib.define("chunk_padded_mm(Tensor a, bool a_transposed, Tensor b, Tensor? bias, int pad_m, int pad_k) -> Tensor")


def _mm_into(out: torch.Tensor, x: torch.Tensor, b: torch.Tensor, bias) -> None:
    if bias is None:
        torch.mm(x, b, out=out)
    else:
        torch.addmm(bias, x, b, out=out)


def _column_chunks(buf: torch.Tensor, src: torch.Tensor, cols: int, width: int):
    """Yield (c0, w, buf[:, :w] holding columns c0 .. c0 + w of src padded with zeros to `cols` columns) for
    each chunk of `width` columns; buf's rows past src's stay as they are (zero). A chunk made only of
    padding copies nothing."""
    from ..runtime.row_copy import copy_rows
    rows, real_cols = src.shape
    for c0 in range(0, cols, width):
        w = min(width, cols - c0)
        real = max(0, min(w, real_cols - c0))
        if real:
            copy_rows(buf[:rows, :real], src[:, c0:c0 + real])
        if real < w:
            buf[:rows, real:w].zero_()
        yield c0, w, buf[:, :w]


def _column_chunk_copies(src: torch.Tensor, width: int) -> set:
    """The row copies (columns, source row stride, destination row stride) _column_chunks launches."""
    cols = src.shape[1]
    return {(n, src.stride(0), width) for n in (min(width, cols), cols % width) if n}


def _chunk_padded_mm(a: torch.Tensor, a_transposed: bool, b: torch.Tensor, bias, pad_m: int, pad_k: int):
    """pad(A) @ b (+ bias), A = a.t() if a_transposed else a, A [M, K] padded by pad_m rows and pad_k
    columns of zeros: [M + pad_m, N]. A is never padded whole: a chunk of the product's rows at a time is
    copied into an aligned buffer (a's rows; a's columns, read transposed, when a_transposed)."""
    from ..runtime.row_copy import copy_rows
    M, K = (a.shape[1], a.shape[0]) if a_transposed else a.shape
    out = a.new_empty((M + pad_m, b.shape[1]))
    if a_transposed:
        # buffer [K + pad_k, width]: a's columns c0.. as rows of A, read with the buffer's aligned row stride
        width = padded_mm_rows(M + pad_m, K + pad_k, a.element_size())
        for c0, w, chunk in _column_chunks(a.new_zeros((K + pad_k, width)), a, M + pad_m, width):
            _mm_into(out[c0:c0 + w], chunk.t(), b, bias)
        return out
    rows = padded_mm_rows(M, K + pad_k, a.element_size())
    buf = a.new_zeros((rows, K + pad_k))
    for r in range(0, M, rows):
        c = min(rows, M - r)
        copy_rows(buf[:c, :K], a[r:r + c])
        _mm_into(out[r:r + c], buf[:c], b, bias)
    if pad_m:                    # rows of zeros times b
        out[M:].copy_(bias.expand(pad_m, -1)) if bias is not None else out[M:].zero_()
    return out


_lib.impl("chunk_padded_mm", _chunk_padded_mm, "CompositeExplicitAutograd")


def chunk_padded_mm_copies(a: torch.Tensor, a_transposed: bool, pad_m: int, pad_k: int) -> set:
    """The row copies (columns, source row stride, destination row stride) chunk_padded_mm launches for a
    (a fake will do), so that a compiling graph can have them built ahead (runtime/row_copy.py)."""
    if a_transposed:
        K, M = a.shape
        return _column_chunk_copies(a, padded_mm_rows(M + pad_m, K + pad_k, a.element_size()))
    M, K = a.shape
    return {(K, a.stride(0), K + pad_k)}


@torch.library.register_fake("ember::chunk_padded_mm")
def _chunk_padded_mm_fake(a, a_transposed, b, bias, pad_m, pad_k):
    m = a.shape[1] if a_transposed else a.shape[0]
    return a.new_empty((m + pad_m, b.shape[1]))


chunk_padded_mm = torch.ops.ember.chunk_padded_mm.default


_lib.define("chunk_padded_mm_pair(Tensor g, Tensor b, Tensor bt, int pad_rows, int pad_cols) -> (Tensor, Tensor)")
# Columns of g per chunk of ember::chunk_padded_mm_pair: its input-side product adds each chunk's partial
# product into a float32 accumulator, so fewer, wider chunks read and write that accumulator fewer times
PAIR_CHUNK_BYTES = 128 << 20


def pair_chunk_width(rows: int, cols: int, itemsize: int) -> int:
    """Columns per chunk of ember::chunk_padded_mm_pair over a padded [rows, cols] input."""
    return min(cols, max(PADDED_MM_MIN_ROWS, PAIR_CHUNK_BYTES // max(1, rows * itemsize) // 64 * 64))


def chunk_padded_mm_pair_copies(g: torch.Tensor, pad_rows: int, pad_cols: int) -> set:
    """The row copies (columns, source row stride, destination row stride) chunk_padded_mm_pair launches."""
    (R, C) = g.shape
    return _column_chunk_copies(g, pair_chunk_width(R + pad_rows, C + pad_cols, g.element_size()))


def _add_product(acc: torch.Tensor, x: torch.Tensor, b: torch.Tensor, first: bool) -> None:
    """acc (float32) = x @ b, or += x @ b, the product's sum kept in float32."""
    if x.dtype == acc.dtype:
        torch.mm(x, b, out=acc) if first else acc.addmm_(x, b)
    elif acc.is_cuda:
        # cuBLAS writes the 16-bit product's float32 sum (torch's mm / addmm with out_dtype: CUDA only)
        if first:
            torch.mm(x, b, out_dtype=acc.dtype, out=acc)
        else:
            torch.addmm(acc, x, b, out_dtype=acc.dtype, out=acc)
    elif first:
        acc.copy_(torch.mm(x, b))
    else:
        acc.add_(torch.mm(x, b))


def _chunk_padded_mm_pair(g: torch.Tensor, b: torch.Tensor, bt: torch.Tensor, pad_rows: int, pad_cols: int):
    """(G @ b, G.t() @ bt) for G = g [R, C] padded by pad_rows rows and pad_cols columns of zeros, b
    [C + pad_cols, N1], bt [R + pad_rows, N2]: the two products of a backward that read its incoming
    gradient as is and transposed (an LM head's input and weight gradients from the logits gradient), in
    one loop over column chunks of g, each copied once into an aligned buffer. The transposed product's
    rows of a chunk are complete; the other product sums the chunks' partial products in float32."""
    R, C = g.shape
    rows, cols = R + pad_rows, C + pad_cols
    width = pair_chunk_width(rows, cols, g.element_size())
    acc = torch.empty((rows, b.shape[1]), dtype=torch.float32, device=g.device)
    out_t = g.new_empty((cols, bt.shape[1]))
    for c0, w, chunk in _column_chunks(g.new_zeros((rows, width)), g, cols, width):
        torch.mm(chunk.t(), bt, out=out_t[c0:c0 + w])
        _add_product(acc, chunk, b[c0:c0 + w], first=c0 == 0)
    return acc.to(g.dtype), out_t


_lib.impl("chunk_padded_mm_pair", _chunk_padded_mm_pair, "CompositeExplicitAutograd")


@torch.library.register_fake("ember::chunk_padded_mm_pair")
def _chunk_padded_mm_pair_fake(g, b, bt, pad_rows, pad_cols):
    return g.new_empty((g.shape[0] + pad_rows, b.shape[1])), g.new_empty((g.shape[1] + pad_cols, bt.shape[1]))


chunk_padded_mm_pair = torch.ops.ember.chunk_padded_mm_pair.default


_lib.define("dropout_bits(SymInt bytes, float p, Device device) -> Tensor", tags=(torch.Tag.nondeterministic_seeded,))


def _dropout_bits(bytes: int, p: float, device):
    keep = torch.rand(bytes * 8, device=device) >= p
    shifts = torch.arange(8, dtype=torch.uint8, device=device)
    return (keep.view(-1, 8).to(torch.uint8) << shifts).sum(1, dtype=torch.uint8)


_lib.impl("dropout_bits", _dropout_bits, "CompositeExplicitAutograd")


@torch.library.register_fake("ember::dropout_bits")
def _dropout_bits_fake(bytes, p, device):
    return torch.empty((bytes,), dtype=torch.uint8, device=device)


dropout_bits = torch.ops.ember.dropout_bits.default


_lib.define("integer_resize(Tensor x, int[]? size, float[]? scale_factor, str mode, bool? align_corners, "
            "bool antialias) -> Tensor")


def _integer_resize(x, size, scale_factor, mode: str, align_corners, antialias: bool):
    return torch.nn.functional.interpolate(x, size=size, scale_factor=scale_factor, mode=mode,
                                           align_corners=align_corners, antialias=antialias)


_lib.impl("integer_resize", _integer_resize, "CompositeExplicitAutograd")


@torch.library.register_fake("ember::integer_resize")
def _integer_resize_fake(x, size, scale_factor, mode, align_corners, antialias):
    # the float decomposition that a fake tensor runs has eager's output size and memory format
    return _integer_resize(x, size, scale_factor, mode, align_corners, antialias)


integer_resize = torch.ops.ember.integer_resize.default
