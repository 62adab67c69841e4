"""C++/OpenMP kernels for CPU tensors: kernel.py renders a fused group as a C++ function, build.py
compiles a graph's kernels into one cached shared library and loads them with ctypes, backend.py is the
kernel backend object that ties them together."""
