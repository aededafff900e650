"""fusec: a fusion compiler for chains of elementwise GPU kernels."""
from .errors import ArgumentError, FzError

__version__ = "0.1.0"
__all__ = ["ArgumentError", "FzError", "__version__"]

from .jit import jit  # noqa: E402

__all__ += ["jit"]

from .trace import FUNCTIONS as _FUNCTIONS, TraceError, cast  # noqa: E402

globals().update(_FUNCTIONS)
__all__ += ["TraceError", "cast", *_FUNCTIONS]
