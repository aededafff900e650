"""fusec: a fusion compiler for chains of elementwise GPU kernels."""
from fusec.errors import ArgumentError, FzError

__version__ = "0.1.0"
__all__ = ["ArgumentError", "FzError", "__version__"]

from fusec.jit import jit  # noqa: E402

__all__ += ["jit"]

from fusec.frontend.trace import FUNCTIONS as _FUNCTIONS  # noqa: E402
from fusec.frontend.trace import TraceError, cast  # noqa: E402

globals().update(_FUNCTIONS)
__all__ += ["TraceError", "cast", *_FUNCTIONS]

from fusec.interop.torch_op import torch_op  # noqa: E402  (imports torch only when called)

__all__ += ["torch_op"]
