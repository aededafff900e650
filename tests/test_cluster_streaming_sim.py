"""Streaming cluster kernels on the sim (sim tier): a persistent grid of clusters,
each taking every clusters-th row and loading its next row's vectors before this
row's reductions (target.CLUSTER_FORM), gives the resident cluster kernel's bits
(a cluster a row, the same order of reduction) for every row example, f32 and
bf16: rows not a multiple of the clusters, fewer rows than clusters, clusters
that push their values (2 blocks) and pull them (16)."""
import numpy as np
import pytest
from helpers import EXAMPLES, load_program

import fusec

pytestmark = pytest.mark.sim
ROW_EXAMPLES = [p for p in EXAMPLES if p.stem in ("softmax", "log_softmax", "rmsnorm", "layernorm", "add_rmsnorm",
                                                 "cross_entropy")]


def force_clusters(monkeypatch, form: str, blocks: tuple[int, ...] = (2,)) -> None:
    """Only clusters of `blocks` blocks of two warps (else a block a row), in `form`;
    streaming wherever a cluster serves (the sim has no registers to run out of)."""
    import fusec.passes.variants as variants
    monkeypatch.setattr(variants, "ROW_STRATEGIES", ("resident", "cluster", "block"))
    monkeypatch.setattr(variants, "WARP_ROW_BYTES", -1)
    monkeypatch.setattr(variants, "RESIDENT_THREADS", ())
    monkeypatch.setattr(variants, "CLUSTER_THREADS", (64,))
    monkeypatch.setattr(variants, "CLUSTER_BLOCKS", blocks)
    monkeypatch.setattr(variants, "CLUSTER_FORM", form)
    if form == "streaming":
        monkeypatch.setattr(variants, "_cluster_streams", lambda *args: True)


def launched(f, before: int) -> tuple[str, bool]:
    """The row kernel's variant launched since `before` launches, and whether it streams its rows."""
    from fusec.ir.launch import RowGrid
    variants = {v.name: v for k in f._runner.interface.kernels for v in k.variants}
    row = [variants[n] for n in f._runner.backend.launched[before:] if isinstance(variants[n].grid, RowGrid)]
    assert len(row) == 1, f._runner.backend.launched[before:]
    return row[0].name, row[0].grid.persistent


def arguments(pipeline, rows: int, length: int) -> list:
    """Random arguments: each array's last dim `length` (1 stays 1), the others `rows`."""
    rng = np.random.default_rng(rows)
    args = []
    for p in pipeline.params:
        if p.shape is None:  # a scalar (eps)
            args.append(1e-5)
            continue
        shape = tuple(d if isinstance(d, int) else length if j == len(p.shape) - 1 else rows
                      for j, d in enumerate(p.shape))
        values = rng.standard_normal(shape).astype(np.float32)
        args.append(values.astype(p.type.numpy_dtype) if not p.type.is_int else
                    rng.integers(0, length, shape).astype(p.type.numpy_dtype))
    return args


def outputs(path, form, rows, clusters, monkeypatch, blocks=(2,), length=2048):
    """Each pipeline of `path` on `rows` rows of `length`, the sim running `clusters` at once."""
    import fusec.runtime.backends.sim as sim
    with monkeypatch.context() as m:
        force_clusters(m, form, blocks)
        m.setattr(sim, "PERSISTENT_SIM_BLOCKS", clusters)
        module = fusec.jit(str(path), backend="sim")
        out = {}
        for pipeline in load_program(path).pipelines:
            args = arguments(pipeline, rows, length)
            if "label" in [p.name for p in pipeline.params]:  # labels inside the vocabulary, one ignored
                args[1] = np.random.default_rng(1).integers(0, length, (rows, 1)).astype(args[1].dtype)
                args[1][0, 0] = -100
            f = getattr(module, pipeline.name)
            before = len(f._runner.backend.launched)
            got = f(*args)
            name, persistent = launched(f, before)
            out[pipeline.name] = (got if isinstance(got, tuple) else (got,), name, persistent, args)
        return out


@pytest.mark.parametrize("path", ROW_EXAMPLES, ids=lambda p: p.stem)
def test_streaming_clusters_give_the_resident_clusters_bits(path, monkeypatch):
    """5 rows on 3 clusters (two take two rows, one a row) and 1 row on 3 (two
    clusters with no row), the same bits as a cluster a row, and the reference's."""
    for rows, clusters in ((5, 3), (1, 3)):
        streaming = outputs(path, "streaming", rows, clusters, monkeypatch)
        resident = outputs(path, "resident", rows, clusters, monkeypatch)
        reference = fusec.jit(str(path), backend="numpy")
        for name, (got, variant, persistent, args) in streaming.items():
            same, other, persistent_before, _ = resident[name]
            assert "_c2_r64_" in variant and variant == other and persistent and not persistent_before, variant
            want = getattr(reference, name)(*args)
            want = want if isinstance(want, tuple) else (want,)
            for g, s, w in zip(got, same, want):
                np.testing.assert_array_equal(g.view(np.uint8), s.view(np.uint8), err_msg=f"{name} {rows} rows")
                tolerance = 2.0 ** -7 if g.dtype != np.float32 else 1e-5
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tolerance,
                                           atol=tolerance, err_msg=name)


@pytest.mark.parametrize("blocks", [4, 16])
def test_streaming_clusters_that_push_and_pull_reuse_their_slots_a_row_apart(blocks, monkeypatch):
    """Clusters of 4 (each block writes its values into the others' shared memory)
    and of 16 (each reads the others'), 2 at once over 5 rows: each takes 2 or 3
    rows; RMSNorm's one combine a row, its slots alternating between rows (with
    two, the other's barrier keeps a block from writing a row's value before the
    others have read the last row's); the resident kernel's bits."""
    path = next(p for p in ROW_EXAMPLES if p.stem == "rmsnorm")
    length = 64 * 4 * 8 * blocks // 2  # half the cluster's capacity (f32)
    streaming = outputs(path, "streaming", 5, 2, monkeypatch, (blocks,), length)
    resident = outputs(path, "resident", 5, 2, monkeypatch, (blocks,), length)
    got, variant, persistent, _ = streaming["rmsnorm"]
    same, other, _, _ = resident["rmsnorm"]
    assert variant == other == f"rmsnorm_k0_c{blocks}_r64_v4" and persistent
    for g, s in zip(got, same):
        np.testing.assert_array_equal(g.view(np.uint8), s.view(np.uint8))
