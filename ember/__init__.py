"""ember: a graph compiler for PyTorch. `torch.compile(model, backend="ember")`."""
import os as _os
import sys as _sys

# Without a GPU, Triton kernels can only run in Triton's interpreter, which must be switched on before
# triton is first imported. Do it here, the first point ember is in control, unless the user chose.
if "TRITON_INTERPRET" not in _os.environ and "triton" not in _sys.modules:
    import torch as _torch
    if not _torch.cuda.is_available():
        _os.environ["TRITON_INTERPRET"] = "1"
from .config import config
from . import metrics
from . import codegen as _codegen  # noqa: F401  registers the built-in kernel backends
from .compile_graph import EmberCompileError, compile_graph
from .runtime.checks import EmberNanError
from .dynamo import ember_backend as backend

from .dynamo import register as _register

_register()

if config.report:       # EMBER_REPORT=out.html: start the report now, so that it sees Dynamo's first graph break
    from .report import recorder as _report_recorder
    _report_recorder()

__all__ = ["backend", "compile_graph", "config", "metrics", "EmberCompileError", "EmberNanError"]
__version__ = "0.1.0"
