"""The sim runs thread-block clusters (fusec_sim.h): a cluster's blocks each on
an OS thread of their own, one at a time, meeting at the cluster's barrier and
reading each other's shared memory (__cluster_map_shared_rank), as sm_90 does.
Hand-written CUDA C compiled as the sim compiles a module, exact results;
misuse is an error, not a hang. Sim tier (g++)."""
import re

import numpy as np
import pytest
from test_sim_threads_sim import Module

pytestmark = pytest.mark.sim

CLUSTERS = r"""
// Each block sums its part of the row (blockDim.x threads, one element each) into
// shared memory; after the cluster's barrier every block reads every block's sum,
// lowest rank first, and writes the row's total (out[blockIdx.x]) and its rank.
extern "C" __global__ void cluster_sum(const float* __restrict__ x, float* __restrict__ out,
                                       unsigned* __restrict__ ranks)
{
    __shared__ float part[1];
    const unsigned rank = __clusterRelativeBlockRank();
    if (threadIdx.x == 0) part[0] = 0;
    __syncthreads();
    for (unsigned t = 0; t < blockDim.x; ++t) {
        if (threadIdx.x == t) part[0] += x[blockIdx.x * blockDim.x + t];
        __syncthreads();
    }
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    if (threadIdx.x == 0) {
        float total = 0;
        for (unsigned r = 0; r < CLUSTER; ++r) total += *static_cast<float*>(__cluster_map_shared_rank(part, r));
        out[blockIdx.x] = total;
        ranks[blockIdx.x] = rank;
    }
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
}

// Block 1 of each cluster returns before the cluster's barrier.
extern "C" __global__ void block_returns(float* __restrict__ out)
{
    if (__clusterRelativeBlockRank() == 1) return;
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    out[blockIdx.x] = 1;
}

// Thread 3 of each block returns before the cluster's barrier.
extern "C" __global__ void thread_returns(float* __restrict__ out)
{
    if (threadIdx.x == 3) return;
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    out[blockIdx.x] = 1;
}

// The last block reads block 0's shared memory with no barrier keeping block 0
// (the sim runs the blocks in turn from the barrier: block 0 has returned).
extern "C" __global__ void read_after_return(float* __restrict__ out)
{
    __shared__ float s[1];
    s[0] = blockIdx.x;
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    if (__clusterRelativeBlockRank() == CLUSTER - 1) out[0] = *static_cast<float*>(__cluster_map_shared_rank(s, 0));
}

// Block 0 writes into the last block's shared memory before any cluster barrier.
extern "C" __global__ void write_before_start(float* __restrict__ out)
{
    __shared__ float s[1];
    if (__clusterRelativeBlockRank() == 0) *static_cast<float*>(__cluster_map_shared_rank(s, CLUSTER - 1)) = 1;
    __cluster_barrier_arrive();
    __cluster_barrier_wait();
    out[blockIdx.x] = s[0];
}

// Shared memory of a rank beyond the cluster.
extern "C" __global__ void rank_beyond(float* __restrict__ out)
{
    __shared__ float s[1];
    out[0] = *static_cast<float*>(__cluster_map_shared_rank(s, CLUSTER));
}

// A wait without an arrival.
extern "C" __global__ void wait_alone(float* __restrict__ out)
{
    __cluster_barrier_wait();
    out[0] = 1;
}
"""

PARAMS = {"cluster_sum": ["float*", "float*", "unsigned*"], "block_returns": ["float*"],
          "thread_returns": ["float*"], "rank_beyond": ["float*"], "wait_alone": ["float*"],
          "read_after_return": ["float*"], "write_before_start": ["float*"]}


@pytest.fixture(scope="module", params=[2, 4, 16])
def clusters(request):
    blocks = request.param
    return blocks, Module(CLUSTERS.replace("CLUSTER", str(blocks)),
                          {name: (types, 0, blocks) for name, types in PARAMS.items()})


@pytest.fixture(scope="module")
def unclustered():
    return Module(CLUSTERS.replace("CLUSTER", "2"), {name: (types, 0) for name, types in PARAMS.items()})


def test_each_block_reads_every_blocks_shared_memory_after_the_clusters_barrier(clusters):
    blocks, module = clusters
    grid, block = 3 * blocks, 40
    x = np.random.default_rng(blocks).integers(-50, 50, grid * block).astype(np.float32)
    out, ranks = np.zeros(grid, np.float32), np.zeros(grid, np.uint32)
    module("cluster_sum", grid, block, x, out, ranks)
    totals = x.reshape(grid // blocks, blocks * block).sum(axis=1)  # integers: exact in any order
    np.testing.assert_array_equal(out, np.repeat(totals, blocks))
    np.testing.assert_array_equal(ranks, np.tile(np.arange(blocks), grid // blocks))


def test_a_block_that_returns_before_the_clusters_barrier_fails(clusters):
    blocks, module = clusters
    with pytest.raises(RuntimeError, match=re.escape(
            f"cluster of blocks 0-{blocks - 1}: the cluster's barrier reached by {blocks - 1} of its {blocks} blocks; "
            "block 1 returned without reaching it")):
        module("block_returns", 2 * blocks, 32, np.zeros(2 * blocks, np.float32))
    out = np.zeros(blocks, np.float32)  # the next launch is not disturbed
    module("cluster_sum", blocks, 8, np.ones(8 * blocks, np.float32), out, np.zeros(blocks, np.uint32))
    np.testing.assert_array_equal(out, 8 * blocks)


def test_a_thread_that_returns_before_the_clusters_barrier_fails(clusters):
    _, module = clusters
    with pytest.raises(RuntimeError, match=re.escape("block 0: the cluster's barrier reached by 31 of its 32 threads; "
                                                     "the others returned without reaching it (thread 3 did)")):
        module("thread_returns", clusters[0], 32, np.zeros(clusters[0], np.float32))


def test_reading_a_returned_blocks_shared_memory_fails(clusters):
    """The pull exchange's last barrier keeps every block until the others have read it."""
    blocks, module = clusters
    with pytest.raises(RuntimeError, match=re.escape(f"block {blocks - 1}: __cluster_map_shared_rank() to block 0 "
                                                     "of its cluster, which has returned")):
        module("read_after_return", blocks, 32, np.zeros(1, np.float32))


def test_writing_to_a_block_before_the_clusters_first_barrier_fails(clusters):
    """The push exchange's first combine waits for an arrival every block makes at its start."""
    blocks, module = clusters
    with pytest.raises(RuntimeError, match=re.escape(f"block 0: __cluster_map_shared_rank() to block {blocks - 1} of "
                                                     "its cluster, which has not started")):
        module("write_before_start", blocks, 32, np.zeros(blocks, np.float32))


def test_misused_cluster_intrinsics_fail(clusters, unclustered):
    blocks, module = clusters
    with pytest.raises(RuntimeError, match=re.escape(f"__cluster_map_shared_rank() to rank {blocks} of a cluster "
                                                     f"of {blocks}")):
        module("rank_beyond", blocks, 1, np.zeros(1, np.float32))
    with pytest.raises(RuntimeError, match=re.escape("__cluster_barrier_wait() without __cluster_barrier_arrive()")):
        module("wait_alone", blocks, 1, np.zeros(1, np.float32))
    with pytest.raises(RuntimeError, match=re.escape(f"a grid of {blocks + 1} blocks in clusters of {blocks}")):
        module("block_returns", blocks + 1, 1, np.zeros(blocks + 1, np.float32))
    with pytest.raises(RuntimeError, match=re.escape("__clusterRelativeBlockRank() in a kernel launched without "
                                                     "clusters")):
        unclustered("cluster_sum", 2, 8, np.ones(16, np.float32), np.zeros(2, np.float32), np.zeros(2, np.uint32))
