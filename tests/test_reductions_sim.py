"""Row reductions on the sim (sim tier): the emitted row kernels (each strategy
forced: a warp per row, shuffles alone; a block per row, shuffles, shared
memory and barriers; passes over the row) run on the CPU, fused and unfused, against the NumPy reference: max, min and pick exactly,
sums within the README's bound, and the fused form equal to the unfused one bit
for bit (the same reduction order in both)."""
import math
import re

import ml_dtypes
import numpy as np
import pytest
from helpers import EXAMPLES, load_program, random_args

import fusec

pytestmark = pytest.mark.sim
BF16 = ml_dtypes.bfloat16
EPS32 = float(np.finfo(np.float32).eps)
# Row lengths: one element, fewer than a warp, a warp and one, several
# elements a thread of a 256-thread block; the ends of the rows in registers
# (f32: 256 and 1,024 a warp, 4,096 a block) and just beyond.
LENGTHS = [1, 7, 33, 256, 257, 1000, 1028, 4100]


STRATEGIES = ["lanes-resident", "warp-resident", "block-resident", "cluster-resident", "warp", "block"]


def force(monkeypatch, strategy: str) -> None:
    """Only `strategy`'s variants offered, whatever the row's length: a warp or a
    block per row; held in registers where that can serve (a row's length a
    multiple of its vector, at most what its vectors hold), else the same warp or
    block per row reading the row again (the same threads take the same elements).
    A cluster: of 2 or 4 blocks of two warps each (rows of up to 4,096 or 8,192
    elements), as small as the sim runs quickly."""
    import fusec.passes.variants as variants
    kind, _, resident = strategy.partition("-")
    fallback = "block" if kind in ("block", "cluster") else "warp"  # lanes of a warp: the warp's kernel
    clusters = ("cluster",) if kind == "cluster" else ()
    monkeypatch.setattr(variants, "ROW_STRATEGIES", ("resident",) * bool(resident) + clusters + (fallback, "block"))
    monkeypatch.setattr(variants, "WARP_ROW_BYTES", -1 if fallback == "block" else 1 << 62)
    if kind == "cluster":
        monkeypatch.setattr(variants, "RESIDENT_THREADS", ())
        monkeypatch.setattr(variants, "CLUSTER_THREADS", (64,))
        monkeypatch.setattr(variants, "CLUSTER_BLOCKS", (2, 4))
    elif resident:
        threads = {"lanes": (8, 16), "warp": (32,), "block": (64, 128, 256, 512, 1024)}[kind]
        monkeypatch.setattr(variants, "RESIDENT_THREADS", threads)


@pytest.fixture(params=STRATEGIES)
def strategy(request, monkeypatch):
    """Each row strategy forced, whatever the row's length (where it can serve it)."""
    force(monkeypatch, request.param)
    return request.param


def launched_strategy(f) -> str:
    name = f._runner.backend.launched[-1]
    resident = re.search(r"_r(\d+)(_v\d+)?$", name)
    if re.search(r"_c\d+_r\d+(_v\d+)?$", name):
        return "cluster-resident"
    if resident:
        threads = int(resident.group(1))
        return ("lanes" if threads < 32 else "warp" if threads == 32 else "block") + "-resident"
    return "warp" if "_warp" in name else "block"


def expected_strategy(strategy: str, length: int, width: int = 4) -> str:
    """The strategy forced, or its warp or block per row reading the row again
    where rows of `length` cannot be held (f32: 4 elements a vector; 16 elements
    a thread of a warp or of a block of up to 1,024)."""
    kind, _, resident = strategy.partition("-")
    most = {"cluster": 32 * 4 * 64}.get(kind) or 16 * {"lanes": 16, "warp": 32, "block": 1024}[kind]
    if resident and (length % width or length > most or length == 0):
        return "block" if kind in ("block", "cluster") else "warp"
    return strategy


def run(source: str, *args, fuse="auto"):
    return fusec.jit(source, backend="sim", fuse=fuse)(*args)


def within_sum_bound(got, want, x):
    """|got - want| <= length * eps * sum(|x|) per row (the README's bound for sums)."""
    bound = x.shape[-1] * EPS32 * np.sum(np.abs(x.astype(np.float64)), axis=-1, keepdims=True)
    return np.all(np.abs(got.astype(np.float64) - want.astype(np.float64)) <= bound + 1e-30)


@pytest.mark.parametrize("length", LENGTHS)
def test_every_reduction_against_the_reference(length, strategy):
    rng = np.random.default_rng(length)
    x = (rng.standard_normal((5, length)) * 10).astype(np.float32)
    x[1, length // 2] = np.nan
    x[2] = -np.inf
    index = rng.integers(-1, length + 1, (5, 1))
    source = ("pipeline p(x: f32[r, c], j: i64[r, 1]) -> (s: f32[r, 1], mu: f32[r, 1], hi: f32[r, 1], "
              "lo: f32[r, 1], v: f32[r, 1], l: f32[r, 1], k: f32[r, 1]) {\n"
              "    s = row_sum(x); mu = row_mean(x); hi = row_max(x); lo = row_min(x);\n"
              "    v = row_var(x); l = row_logsumexp(x); k = row_pick(x, j);\n}")
    want = fusec.jit(source, backend="numpy")(x, index)
    for fuse in ("auto", "none"):
        f = fusec.jit(source, backend="sim", fuse=fuse)
        got = f(x, index)
        assert launched_strategy(f) == expected_strategy(strategy, length)
        s, mu, hi, lo, v, lse, k = got
        np.testing.assert_array_equal(hi, want[2])
        np.testing.assert_array_equal(lo, want[3])
        np.testing.assert_array_equal(k, want[6])
        assert np.array_equal(np.isnan(s), np.isnan(want[0]))
        finite = np.isfinite(want[0])
        assert within_sum_bound(s[finite], want[0][finite], x[finite[:, 0]])
        assert within_sum_bound(mu[finite] * length, want[1][finite] * length, x[finite[:, 0]])
        ok = np.isfinite(want[5])
        np.testing.assert_array_equal(lse[~ok], want[5][~ok])
        assert np.all(np.abs(lse[ok] - want[5][ok]) <= 8 * EPS32 * np.maximum(1, np.abs(want[5][ok])) + length * EPS32)
        okv = np.isfinite(want[4])
        spread = np.mean(np.abs(x[okv[:, 0]].astype(np.float64)), axis=-1, keepdims=True) ** 2
        assert np.all(np.abs(v[okv] - want[4][okv]) <= 4 * length * EPS32 * (want[4][okv] + spread[:, 0]))


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "row_" in p.read_text()], ids=lambda p: p.stem)
def test_each_row_example_fused_equals_unfused_bit_for_bit_and_the_reference_closely(path, strategy):
    module = fusec.jit(str(path), backend="sim")
    unfused = fusec.jit(str(path), backend="sim", fuse="none")
    reference = fusec.jit(str(path), backend="numpy")
    for pipeline in load_program(path).pipelines:
        args = random_args(pipeline, 300, seed=5)
        if "label" in [p.name for p in pipeline.params]:  # labels inside the vocabulary, one ignored
            vocab = args[0].shape[-1]
            args[1] = np.random.default_rng(1).integers(0, vocab, args[1].shape)
            args[1][0, 0] = -100
        got = getattr(module, pipeline.name)(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])
        same = getattr(unfused, pipeline.name)(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])
        want = getattr(reference, pipeline.name)(*[a.copy() if isinstance(a, np.ndarray) else a for a in args])
        got, same, want = (v if isinstance(v, tuple) else (v,) for v in (got, same, want))
        for g, u, w in zip(got, same, want):
            np.testing.assert_array_equal(g.view(np.uint8), u.view(np.uint8), err_msg=pipeline.name)
            tolerance = 2.0 ** -7 if g.dtype == BF16 else 1e-5  # a bf16 output: its last bit may differ
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tolerance, atol=tolerance,
                                       err_msg=pipeline.name)


def test_leading_dims_broadcasts_and_per_row_inputs(strategy):
    """A 3-D row space, a per-column weight, a per-row input broadcast along the
    middle dim, per-row results returned, each dim its own size."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 37)).astype(np.float32)
    w = rng.standard_normal(37).astype(np.float32)
    g = rng.standard_normal((3, 1, 1)).astype(np.float32)
    source = ("pipeline p(x: f32[a, b, c], w: f32[c], g: f32[a, 1, 1]) -> (y: f32[a, b, c], m: f32[a, b, 1]) {\n"
              "    m = row_max(x * w) + g;\n    y = x * w - m;\n}")
    want = fusec.jit(source, backend="numpy")(x, w, g)
    for fuse in ("auto", "none"):
        y, m = run(source, x, w, g, fuse=fuse)
        np.testing.assert_array_equal(m, want[1])
        np.testing.assert_array_equal(y, want[0])


def test_softmax_of_huge_values_does_not_overflow_and_empty_rows_get_their_identity(strategy):
    x = np.array([[3e38, 3e38, -3e38], [-1e30, -1e30, -1e30]], np.float32)
    source = "pipeline p(x: f32[r, c]) -> (y: f32[r, c]) { m = row_max(x); e = exp(x - m); y = e / row_sum(e); }"
    y = run(source, x)
    np.testing.assert_array_equal(y, np.array([[0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]], np.float32))
    empty = np.zeros((3, 0), np.float32)
    s = run("pipeline p(x: f32[r, c]) -> (s: f32[r, 1], m: f32[r, 1]) { s = row_sum(x); m = row_max(x); }", empty)
    np.testing.assert_array_equal(s[0], [[0], [0], [0]])
    np.testing.assert_array_equal(s[1], [[-math.inf]] * 3)


def test_an_inout_row_normalised_in_place(strategy):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    want = x / x.sum(-1, keepdims=True)
    f = fusec.jit("pipeline p(inout x: f32[r, c]) { x = x / row_sum(x); }", backend="sim")
    f(x)
    np.testing.assert_allclose(x, want, rtol=2e-7)


@pytest.mark.parametrize("length,variant", [(300, "p_k0_cached_v4"), (12032, "p_k0_cached_v4"), (12033, "p_k0")])
def test_the_row_is_kept_in_shared_memory_where_it_fits(length, variant, monkeypatch):
    force(monkeypatch, "block")
    """A row kernel that reads x in several passes keeps it in shared memory (47
    KiB: 12032 f32 elements; the static partials take from the same 48) and
    reads it again from memory beyond; both give the same bits."""
    rng = np.random.default_rng(length)
    x = rng.standard_normal((2, length)).astype(np.float32)
    w = rng.standard_normal(length).astype(np.float32)
    source = ("pipeline p(x: f32[r, c], w: f32[c]) -> (y: f32[r, c], s: f32[r, 1]) {\n"
              "    s = row_var(x * w);\n    y = (x * w - row_mean(x * w)) * rsqrt(s + 1e-5);\n}")
    f = fusec.jit(source, backend="sim")
    y, s = f(x, w)
    assert f._runner.backend.launched[-1] == variant
    want = fusec.jit(source, backend="numpy")(x, w)
    np.testing.assert_allclose(y, want[0], rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(s, want[1], rtol=2e-4)
    if "cached" in variant:  # the kernel reading its row from memory in each pass: the same bits
        import fusec.ir.launch as launch  # where Variant.takes_rows reads it
        monkeypatch.setattr(launch, "ROW_CACHE_BYTES", 0)
        g = fusec.jit(source, backend="sim")
        again = g(x, w)
        assert g._runner.backend.launched[-1] == "p_k0_v4"
        np.testing.assert_array_equal(again[0], y)
        np.testing.assert_array_equal(again[1], s)


@pytest.mark.parametrize("rows,length", [(3, 1024), (9, 1025), (17, 40)])
def test_the_runtime_takes_a_warp_per_row_up_to_its_limit_and_a_block_beyond(rows, length, monkeypatch):
    """Rows of at most target.WARP_ROW_BYTES a warp each (eight a block: a
    count of rows not a multiple of eight leaves a block's last warps idle), longer
    rows a block each (rows held in registers aside: their own test)."""
    import fusec.passes.variants as variants
    monkeypatch.setattr(variants, "ROW_STRATEGIES", ("warp", "block"))
    from fusec.target import WARP_ROW_BYTES
    x = np.random.default_rng(length).standard_normal((rows, length)).astype(np.float32)
    source = "pipeline p(x: f32[r, c]) -> (y: f32[r, c]) { m = row_max(x); e = exp(x - m); y = e / row_sum(e); }"
    f = fusec.jit(source, backend="sim")
    y = f(x)
    assert launched_strategy(f) == ("warp" if length * 4 <= WARP_ROW_BYTES else "block")
    np.testing.assert_allclose(y, fusec.jit(source, backend="numpy")(x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("length,offset,variant", [(64, 0, "p_k0_warp_v8"), (66, 0, "p_k0_warp"),
                                                   (64, 1, "p_k0_warp"), (2056, 0, "p_k0_cached_v8"), (2050, 0, "p_k0_cached")])
def test_rows_move_as_16_byte_vectors_where_their_length_and_alignment_allow(length, offset, variant, monkeypatch):
    """bf16 rows: eight elements (16 bytes) a thread a pass where the row's length is a
    multiple of eight and every array is aligned to its vector; one element a thread
    otherwise (an odd length; an array starting one element into its allocation)."""
    import fusec.passes.variants as variants
    monkeypatch.setattr(variants, "ROW_STRATEGIES", ("warp", "block"))  # rows in registers: their own test
    rng = np.random.default_rng(length + offset)
    x = rng.standard_normal(3 * length + offset).astype(BF16)[offset:].reshape(3, length)
    w = rng.standard_normal(length + offset).astype(BF16)[offset:]
    source = ("pipeline p(x: bf16[r, c], w: bf16[c]) -> (y: bf16[r, c], s: f32[r, 1]) {\n"
              "    s = row_sum(x * w);\n    y = x * w / s;\n}")
    f = fusec.jit(source, backend="sim")
    y, s = f(x, w)
    assert f._runner.backend.launched[-1] == variant
    want = fusec.jit(source, backend="numpy")(x, w)
    xw = (x.astype(np.float32) * w.astype(np.float32)).astype(BF16)
    assert within_sum_bound(s, want[1], xw)
    np.testing.assert_allclose(y.astype(np.float32), (xw.astype(np.float32) / s).astype(BF16).astype(np.float32),
                               rtol=2 ** -7, atol=1e-6)


@pytest.mark.parametrize("dtype,length,variant", [
    ("f32", 64, "p_k0_r8_v4"), ("f32", 128, "p_k0_r8_v4"), ("f32", 200, "p_k0_r16_v4"), ("f32", 260, "p_k0_r32_v4"),
    ("f32", 512, "p_k0_r32_v4"), ("f32", 516, "p_k0_r64_v4"),
    ("f32", 1024, "p_k0_r64_v4"), ("f32", 1028, "p_k0_r128_v4"), ("f32", 4096, "p_k0_r256_v4"),
    ("f32", 4100, "p_k0_r512_v4"), ("f32", 16384, "p_k0_r1024_v4"), ("f32", 16388, "p_k0_c4_r256_v4"),
    ("f32", 262148, "p_k0_v4"), ("bf16", 16392, "p_k0_c4_r256_v8"),
    ("f32", 1030, "p_k0_cached"), ("bf16", 256, "p_k0_r16_v8"), ("bf16", 512, "p_k0_r32_v8"), ("bf16", 520, "p_k0_r64_v8"),
    ("bf16", 4104, "p_k0_r256_v8"), ("bf16", 8200, "p_k0_r512_v8")])
def test_rows_are_held_in_registers_by_a_warp_or_a_block_up_to_what_their_vectors_hold(dtype, length, variant,
                                                                                        monkeypatch):
    """The runtime takes the row kept in registers by the fewest threads that hold
    it 16 elements each (8 or 16 lanes of a warp, a warp, a block of 64 to
    1,024, or a cluster of 2 to 16 blocks of 256 or 512, 32 elements a thread), else the shared
    memory, else memory again. A warp's, and a block of 256's, take the elements
    their warp or block per row reading memory in every pass takes: the same bits
    (the same order of reduction); each follows the reference."""
    rng = np.random.default_rng(length)
    x = rng.standard_normal((3, length)).astype(BF16 if dtype == "bf16" else np.float32)
    source = (f"pipeline p(x: {dtype}[r, c]) -> (y: {dtype}[r, c], s: f32[r, 1]) {{\n"
              "    m = row_max(x); e = exp(x - m); s = row_sum(e); y = e / s;\n}")
    f = fusec.jit(source, backend="sim")
    y, s = f(x)
    assert f._runner.backend.launched[-1] == variant
    want = fusec.jit(source, backend="numpy")(x)
    np.testing.assert_allclose(s, want[1], rtol=1e-5)
    tolerance = 2.0 ** -7 if dtype == "bf16" else 1e-5
    np.testing.assert_allclose(y.astype(np.float64), want[0].astype(np.float64), rtol=tolerance, atol=1e-7)
    family = {"_r32_": "warp", "_r256_": "block"}.get(re.sub(r".*(_r\d+_).*", r"\1", variant))
    if family and not re.search(r"_c\d+_r", variant):  # a cluster's threads combine in another order
        force(monkeypatch, family)
        import fusec.ir.launch as launch  # where Variant.takes_rows reads it
        monkeypatch.setattr(launch, "ROW_CACHE_BYTES", 0)
        g = fusec.jit(source, backend="sim")
        again = g(x)
        assert launched_strategy(g) == family and "cached" not in g._runner.backend.launched[-1]
        np.testing.assert_array_equal(y.view(np.uint8), again[0].view(np.uint8))
        np.testing.assert_array_equal(s, again[1])


@pytest.mark.parametrize("blocks", [2, 4, 16])
def test_a_cluster_of_more_blocks_than_its_blocks_have_warps(blocks, monkeypatch):
    """Each block's value reaches every other block, whichever lane of the first warp
    writes it (blocks of two warps; clusters of two and four write theirs into the
    others' shared memory, of 16 read the others')."""
    import fusec.passes.variants as variants
    monkeypatch.setattr(variants, "ROW_STRATEGIES", ("resident", "cluster", "block"))
    monkeypatch.setattr(variants, "RESIDENT_THREADS", ())
    monkeypatch.setattr(variants, "CLUSTER_THREADS", (64,))
    monkeypatch.setattr(variants, "CLUSTER_BLOCKS", (blocks,))
    x = np.random.default_rng(blocks).integers(-40, 40, (3, 64 * 32 * blocks)).astype(np.float32)
    source = ("pipeline p(x: f32[r, c]) -> (s: f32[r, 1], hi: f32[r, 1], l: f32[r, 1], y: f32[r, c]) {\n"
              "    s = row_sum(x); hi = row_max(x); l = row_logsumexp(x); y = x - hi + s - l;\n}")
    f = fusec.jit(source, backend="sim")
    s, hi, lse, y = f(x)  # the per-row values rank 0 stores; y, every block's own
    assert f._runner.backend.launched[-1] == f"p_k0_c{blocks}_r64_v4"
    want = fusec.jit(source, backend="numpy")(x)
    np.testing.assert_array_equal(s, want[0])  # integers: exact in any order
    np.testing.assert_array_equal(hi, want[1])
    np.testing.assert_allclose(lse, want[2], rtol=4 * EPS32)
    np.testing.assert_allclose(y, x - hi + s - lse, rtol=0, atol=2 ** -12)


def test_statements_in_a_repeat_over_a_reductions_rows_stay_out_of_its_row_kernel():
    """A loop body's kernel iterates in registers; its [r, c] and [r, 1] statements
    are not made a row kernel (reductions are not allowed in a loop)."""
    source = ("pipeline p(x: f32[r, c], g: f32[r, 1]) -> (y: f32[r, c], h: f32[r, 1]) {\n"
              "    y = x / row_sum(x * x);\n    h = g;\n"
              "    repeat 3 { y = y * 2.0 + 1.0; h = h * 0.5; }\n}")
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    g = np.array([[1.0], [2.0], [4.0]], np.float32)
    want = fusec.jit(source, backend="numpy")(x, g)
    for fuse in ("auto", "all"):
        got = run(source, x, g, fuse=fuse)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_array_equal(got[1], want[1])


def test_logsumexp_in_one_pass_holds_its_bound_where_the_max_keeps_growing(strategy):
    """row_logsumexp is computed online (a running max, its sum rescaled as the max
    grows): rows rising to the end (a rescale at every element), falling, with an
    infinity or NaN among finite values, all -inf, huge magnitudes, one element;
    the result within the README's bound of the two-pass reference, the
    special values exact."""
    length = 1000
    rising = np.linspace(-50, 50, length, dtype=np.float32)
    rows = [rising, rising[::-1].copy(), np.full(length, 3e38, np.float32), rising * 1e-6,
            np.where(np.arange(length) == 500, np.inf, rising).astype(np.float32),
            np.where(np.arange(length) == 7, np.nan, rising).astype(np.float32),
            np.where(np.arange(length) % 2 == 0, -np.inf, rising).astype(np.float32),
            np.full(length, -np.inf, np.float32),
            # one finite element, first or last: the other threads' parts all -inf (a
            # kernel holding its row sums a thread's terms unguarded, its sum set to 0
            # once where its max is not finite; left NaN, the row's result is NaN)
            np.where(np.arange(length) == 0, 1.5, -np.inf).astype(np.float32),
            np.where(np.arange(length) == length - 1, -2.0, -np.inf).astype(np.float32),
            np.where(np.arange(length) < 8, rising, -np.inf).astype(np.float32)]
    x = np.stack(rows)
    source = "pipeline p(x: f32[r, c]) -> (l: f32[r, 1]) { l = row_logsumexp(x); }"
    got = run(source, x)
    want = fusec.jit(source, backend="numpy")(x)
    special = ~np.isfinite(want)
    np.testing.assert_array_equal(got[special], want[special])
    finite = ~special[:, 0]
    terms = np.sum(np.exp(x[finite].astype(np.float64) - want[finite].astype(np.float64)), axis=-1, keepdims=True)
    assert np.all(np.abs(got[finite] - want[finite]) <=
                  8 * EPS32 * np.maximum(1, np.abs(want[finite])) + length * EPS32 * terms), (got, want)
    one = np.array([[2.5], [-np.inf], [np.nan]], np.float32)
    np.testing.assert_array_equal(run(source, one), [[2.5], [-np.inf], [np.nan]])


@pytest.mark.parametrize("strategy", ["lanes-resident", "block-resident", "cluster-resident", "block"])
def test_a_row_kernels_bf16_and_f16_stores_round_once_to_the_references_bits(strategy, monkeypatch):
    """A row kernel's f16 and bf16 outputs (a cast's operand rounded once where it is
    stored, one element or a vector at a time) equal the reference bit for bit where
    the reductions are exact: x - row_max(x) of f32 values lying on and beside the
    ties between two bf16 (and f16) numbers, of both signs, with NaN and inf rows."""
    force(monkeypatch, strategy)
    length = 256
    rng = np.random.default_rng(5)
    base = rng.integers(-2 ** 12, 2 ** 12, (4, length)).astype(np.float64) * 2.0 ** -6
    # f32 offsets at half an f16/bf16 unit and a hair beside it (each row's max is 64: exact below it)
    offsets = np.array([0, 2.0 ** -17, 2.0 ** -17 + 2.0 ** -30, 2.0 ** -17 - 2.0 ** -30, 2.0 ** -9,
                        2.0 ** -9 + 2.0 ** -28, 2.0 ** -9 - 2.0 ** -28, 3 * 2.0 ** -9])
    x = (base + offsets[np.arange(length) % len(offsets)]).astype(np.float32)
    x[:, 0] = 64.0
    x[2, 5], x[3, 9] = np.nan, np.inf
    source = ("pipeline p(x: f32[r, c]) -> (b: bf16[r, c], h: f16[r, c]) {\n"
              "    d = x - row_max(x);\n    b = bf16(d);\n    h = d;\n}")
    f = fusec.jit(source, backend="sim")
    got = f(x)
    want = fusec.jit(source, backend="numpy")(x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint16)[:2], w.view(np.uint16)[:2])  # finite rows: the bits
        np.testing.assert_array_equal(np.isnan(g[2:].astype(np.float32)), np.isnan(w[2:].astype(np.float32)))
