"""C identifiers for the names in a user's program.

A .fz name may be any identifier, `float`, `threadIdx` or `i` included; in
emitted code a name that collides with a C/C++/CUDA word, a math function,
fusec's own helpers or a name already taken is given a trailing underscore.
"""
from __future__ import annotations

import re

RESERVED = set("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char16_t char32_t char8_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires restrict return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
wchar_t while xor xor_eq main NULL
threadIdx blockIdx blockDim gridDim warpSize dim3 uint3 half __half __nv_bfloat16 nv_bfloat16 atomicAdd
min max abs fabs fabsf sqrt sqrtf rsqrt rsqrtf cbrt cbrtf exp expf exp2 exp2f expm1 expm1f log logf log2 log2f
log10 log10f log1p log1pf sin sinf cos cosf tan tanf asin asinf acos acosf atan atanf atan2 atan2f sinh sinhf
cosh coshf tanh tanhf erf erff pow powf floor floorf ceil ceilf rint rintf round roundf trunc truncf fma fmaf
fmin fminf fmax fmaxf fmod fmodf isnan isinf signbit INFINITY NAN std
""".split())


class Namer:
    """Hands out unique, valid C names, deterministically."""

    def __init__(self) -> None:
        self.taken: set[str] = set(RESERVED)
        self.given: dict[str, str] = {}

    def copy(self) -> "Namer":
        """A namer with the same names taken, for a separate scope."""
        other = Namer()
        other.taken, other.given = set(self.taken), dict(self.given)
        return other

    def user(self, name: str) -> str:
        """The C name of a user's name (a slot, the pipeline); the same name each time."""
        if name not in self.given:
            self.given[name] = self._claim(re.sub(r"\W", "_", name))
        return self.given[name]

    def fresh(self, hint: str) -> str:
        """A new internal name."""
        return self._claim(hint)

    def _claim(self, base: str) -> str:
        if base.startswith("fz_") or base.startswith("__"):
            base = base + "_"
        name = base
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name
