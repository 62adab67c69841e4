"""Code generation: kernels (one folder per kernel backend) and the Wrapper IR that calls them.

The built-in kernel backends are registered here, each made at its first use (ember/device.py)."""
from ..device import register_backend


def _triton(interpret: bool):
    def make():
        from .triton.backend import TritonBackend
        return TritonBackend(interpret)
    return make


def _cpp():
    from .cpp.backend import CppBackend
    return CppBackend()


register_backend("cuda", "triton", _triton(interpret=False), default=True)
register_backend("cpu", "cpp", _cpp, default=True)
register_backend("cpu", "triton", _triton(interpret=True))
