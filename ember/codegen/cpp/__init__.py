"""C++/OpenMP kernels for CPU tensors: kernel.py renders a fused group as a C++ function, build.py
compiles a graph's kernels into one cached shared library and loads them with ctypes."""
from .backend import CppBackend
from .build import CppBuildError, load_cpp_kernels

__all__ = ["CppBackend", "CppBuildError", "load_cpp_kernels"]
