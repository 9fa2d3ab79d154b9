// Exact (row-invariant) attention over the stored KV cache: decode, verify and draft trees,
// with the context split across thread blocks in a fixed partition (split context).
//
// attention_<mode>: query t (logical position pos[t]) attends to the keys it sees, as
// cuda/README.md "Attention geometry" says, reading the stored cache directly: a 64-key
// block's keys and values are loaded together, in 16-byte pieces where the rows allow it
// (att_stage), and dequantized into two shared tiles (one, values after keys, where shared
// memory is short), never into a float copy of the cache. The twin is
// tinyloop/backends/reference/twins/attention.py.
//
// Partition (cuda/README.md "Attention: split context"): chunk c of every query is the
// logical blocks [c S, (c + 1) S), S = ATT_CHUNK_BLOCKS, clipped to the query's own blocks
// first = lowest // 64 .. last = pos // 64. The chunks a query has, first // S .. last // S,
// and what each holds depend on nothing but its position and the window: not on T, not on
// the other queries, not on the grid.
//
// One launch per call, or two (launch/attention.py):
//   pass 1, attention_<mode>: grid (ceil(T / qb), n_kv, max_chunks), block ATT_THREADS (a
//     multiple of 32), dynamic shared 64 tiles stride + qb (2 G hd + 68 G + 5) + 2 floats (stride: att_tile_stride)
//     (or ints), tiles = 2 (keys and values together) or 1, G = n_heads / n_kv. Block
//     (x, g, z) serves queries t = x qb .. x qb + qb - 1 (qb > 1 only without a window: their
//     chunk z is then the same keys; and only with one block table: a launch with per-token
//     tables, query t's row at blocks + table_offsets[t], serves several caches' queries, one
//     a block), each query's chunk c = first // S + z for kv head g and
//     the G query heads sharing it (nothing when c > last // S), and writes the chunk's
//     partial (acc, l, m) to partials[t, g, z] = (G hd + 2 G) floats: acc (G, hd), then l (G),
//     then m (G). With counters, the last block of a query's chunks merges them
//     (attention_merge's arithmetic) into out: one launch.
//   pass 2 (without counters), attention_merge: grid (T, n_kv), block ATT_THREADS, dynamic
//     shared G hd floats. Merges the query's chunks z = 0 .. n_chunks - 1 in increasing order,
//     divides, and (int4-h) rotates back.
//
// Arithmetic, per query head (the twin spells out the same):
//   q' = (int4-h: fwht(q) * norm) * scale
//   pass 1, per chunk: m = -inf, acc = 0, l = 0; per block of the chunk, in increasing order:
//     s_j  = dot(q', k_j): four running sums c_r over d = r, r+4, ... from +0, then
//            (c0 + c1) + (c2 + c3); a masked key gets s_j = -inf
//     bm   = max_j s_j; a block with bm = -inf leaves (m, acc) unchanged
//     m'   = max(m, bm); corr = exp(m - m'); p_j = exp(s_j - m')
//     acc[d] = acc[d] * corr + tree_j(p_j * v_j[d]) for d < hd, and with v = 1 for the
//            probability sum l = acc[hd]; a masked key's term is exactly +0
//     tree_j: adjacent pairwise sum over the 64 keys, ((t0 + t1) + (t2 + t3)) + ...
//     (a chunk whose every block was left unchanged keeps m = -inf: it is empty)
//   pass 2: M = -inf, A = 0, L = 0; per chunk z in increasing order, skipping m_z = -inf:
//     M' = max(M, m_z); a = exp(M - M'); b = exp(m_z - M')
//     A[d] = A[d] * a + acc_z[d] * b; L = L * a + l_z * b; M = M'
//   out = A[d] / L, then (int4-h) fwht(out) * norm
#include "attention_load.cuh"

#define ATT_NEG_INF (-tl_inf())
// launch/attention.py ATT_THREADS: a block's threads. The pass-1 kernels are declared
// __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS): on sm_80 .. sm_90, 4 blocks an SM, at most 128
// registers, which the decode's bytes in flight need (cuda/README.md); ptxas fits the sums'
// loops in them without a spill. ptxas 13.0 for sm_100 and sm_120 (not compiled in CI) spends
// about 255 registers on these kernels and spills 300 to 500 bytes under that cap, 16 or none
// without it: there the cap is left out (2 blocks an SM)
#define ATT_THREADS 128
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define ATT_MIN_BLOCKS 1
#else
#define ATT_MIN_BLOCKS 4
#endif
#define ATT_MERGE_BATCH 16   // chunks whose partials the merge loads at once
#ifndef ATT_CHUNK_BLOCKS              // (tests compile S = 4 too: several blocks a chunk)
#define ATT_CHUNK_BLOCKS 1   // S: 64-key blocks per chunk; twin and launcher keep the same CHUNK_BLOCKS
#endif

// The query's first and last logical 64-key block (README geometry).
__device__ __forceinline__ int att_lowest(int pos, int window) {
    return (window && pos - window + 1 > 0) ? pos - window + 1 : 0;
}

// float32(1 / sqrt(hd)) for hd a power of two (see kv.cu: exact, like kv/modes.py's hadamard()).
__device__ __forceinline__ float att_hadamard_norm(int hd) {
    int k = 0;
    while ((2 << k) <= hd) ++k;            // k = log2(hd)
    float norm = (k & 1) ? 0.70710678118654752f : 1.0f;
    return tl_mul(norm, __int_as_float((127 - (k >> 1)) << 23));
}

// In-place FWHT of n_vec shared vectors of hd floats (stage h: (j, j + h) -> (a + b, a - b)),
// then * norm. Called by every thread.
__device__ void att_fwht(float* x, int n_vec, int hd) {
    const int half = hd / 2;
    for (int h = 1; h < hd; h <<= 1) {
        for (int i = threadIdx.x; i < n_vec * half; i += blockDim.x) {
            int v = i / half, r = i - v * half;
            float* y = x + v * hd + (r / h) * 2 * h + r % h;
            float a = y[0], b = y[h];
            y[0] = tl_add(a, b);
            y[h] = tl_sub(a, b);
        }
        __syncthreads();
    }
    float norm = att_hadamard_norm(hd);
    for (int e = threadIdx.x; e < n_vec * hd; e += blockDim.x) x[e] = tl_mul(x[e], norm);
    __syncthreads();
}

// The fixed-order dot product: four interleaved running sums, then (c0 + c1) + (c2 + c3).
__device__ __forceinline__ float att_dot(const float* q, const float* k, int hd) {
    float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
    int d = 0;
    for (; d + 4 <= hd; d += 4) {
        c0 = tl_add(c0, tl_mul(q[d], k[d]));
        c1 = tl_add(c1, tl_mul(q[d + 1], k[d + 1]));
        c2 = tl_add(c2, tl_mul(q[d + 2], k[d + 2]));
        c3 = tl_add(c3, tl_mul(q[d + 3], k[d + 3]));
    }
    if (d < hd) c0 = tl_add(c0, tl_mul(q[d], k[d]));
    if (d + 1 < hd) c1 = tl_add(c1, tl_mul(q[d + 1], k[d + 1]));
    if (d + 2 < hd) c2 = tl_add(c2, tl_mul(q[d + 2], k[d + 2]));
    return tl_add(tl_add(c0, c1), tl_add(c2, c3));
}

// att_dot where hd is a multiple of 4 and q, k are 16-byte aligned: a step's four elements by
// one 16-byte shared load of each, into the same four running sums in the same order.
__device__ __forceinline__ float att_dot4(const float* q, const float* k, int hd) {
    float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
    for (int d = 0; d < hd; d += 4) {
        // (the tags on both lines: ptxas may give the loads either)
        const float4 a = *reinterpret_cast<const float4*>(q + d), b = *reinterpret_cast<const float4*>(k + d);   // sass: attention-scores
        c0 = tl_add(c0, tl_mul(a.x, b.x));                       // sass: attention-scores
        c1 = tl_add(c1, tl_mul(a.y, b.y));
        c2 = tl_add(c2, tl_mul(a.z, b.z));
        c3 = tl_add(c3, tl_mul(a.w, b.w));
    }
    return tl_add(tl_add(c0, c1), tl_add(c2, c3));
}

// The tiles' row stride in floats (launch/attention.py tile_stride, the same rule): where hd is
// a multiple of 4, hd or hd + 4, whichever is 4 times an odd number, so that 16-byte loads of 8
// consecutive rows (a quarter-warp's, the scores') fall on 8 distinct groups of 4 banks; else
// hd | 1 (odd: a warp reading one column of the tile hits 32 banks).
__device__ __forceinline__ int att_tile_stride(int hd) { return hd % 4 ? (hd | 1) : (hd / 4 % 2 ? hd : hd + 4); }

// Four value columns' sums, added lane by lane.
struct AttQuad {
    float v[4];
};
__device__ __forceinline__ float att_plus(float a, float b) { return tl_add(a, b); }
__device__ __forceinline__ AttQuad att_plus(const AttQuad& a, const AttQuad& b) {
    return AttQuad{{tl_add(a.v[0], b.v[0]), tl_add(a.v[1], b.v[1]), tl_add(a.v[2], b.v[2]), tl_add(a.v[3], b.v[3])}};
}

// Adjacent pairwise sum of f(base) .. f(base + N - 1): tree(N) = tree(first N/2) + tree(last N/2),
// of floats or of AttQuads (each lane its own tree, the same order).
template <int N> struct AttTree {
    template <typename F> __device__ static __forceinline__ auto sum(const F& f, int base) {
        return att_plus(AttTree<N / 2>::sum(f, base), AttTree<N / 2>::sum(f, base + N / 2));
    }
};
template <> struct AttTree<1> {
    template <typename F> __device__ static __forceinline__ auto sum(const F& f, int base) { return f(base); }
};

// AttTree<64> of four value columns as 64 / LEAVES trees of LEAVES keys, in nested loops of two
// halves the compiler keeps: tree(2n trees) = tree(first n) + tree(last n), the same additions.
// A loop's sum starts at -0, the identity of an add (-0 + x is x bit for bit, +0, -0 and NaN
// too), and adds each half: (-0 + first) + second, one add a lane more than the tree and no
// select. What was tried (sm_90, attention_fp16, instructions an element of the unmasked sums):
// - unrolled whole, ptxas loads all 64 leaves' inputs at once (320 registers: it spilled);
// - a loop over 8 trees of 8 joining each to the open sums of its levels (a binary counter)
//   kept those sums in registers picked at run time: 64 moves and selects a tree, 4.75;
// - only the innermost level a loop (the others unrolled): 200 bytes of spills.
// Here (AttTreeLeaves): trees of 8 keys where the kernel fits them in the 128 registers of 4
// blocks an SM (fp32, fp16, int8 caches: 3.1), of 4 for the int4 caches, whose staging holds
// more (8 spilled 8 and 16 bytes there: 3.7). Any leaf count is the same tree, the same bits
// (tests: -DATT_TREE_LEAVES, every mode at that count, changes none).
static_assert(TL_BLOCK == 64, "att_tree64 sums a 64-key block");
template <int MODE> struct AttTreeLeaves {
#ifdef ATT_TREE_LEAVES
    static constexpr int value = ATT_TREE_LEAVES;
#else
    static constexpr int value = MODE == ATT_INT4 ? 4 : 8;
#endif
};
__device__ __forceinline__ AttQuad att_quad_negative_zero() { return AttQuad{{-0.0f, -0.0f, -0.0f, -0.0f}}; }
template <int TREES, int LEAVES> struct AttLoopTree {
    template <typename G> __device__ static __forceinline__ AttQuad sum(const G& g, const float* p, const float* v,
                                                                         int stride) {
        AttQuad both = att_quad_negative_zero();
        // the second half's probabilities and values: pointers stepped, not recomputed
        const int keys = TREES / 2 * LEAVES;
#pragma unroll 1
        for (int half = 0; half < 2; ++half, p += keys, v += keys * stride)   // sass: attention-values-join
            both = att_plus(both, AttLoopTree<TREES / 2, LEAVES>::sum(g, p, v, stride));
        return both;
    }
};
template <int LEAVES> struct AttLoopTree<1, LEAVES> {
    template <typename G> __device__ static __forceinline__ AttQuad sum(const G& g, const float* p, const float* v,
                                                                         int) {
        return g(p, v);
    }
};
// g(p, v): the tree of the LEAVES keys whose probabilities start at p and values at v (rows
// `stride` apart)
template <int LEAVES, typename G>
__device__ __forceinline__ AttQuad att_tree64(const G& g, const float* p, const float* v, int stride) {
    static_assert(LEAVES == 4 || LEAVES == 8 || LEAVES == 16, "LEAVES: 4, 8 or 16");
    return AttLoopTree<64 / LEAVES, LEAVES>::sum(g, p, v, stride);
}

// The merge of query t's chunk partials for kv head g (pass 1's layout) in increasing chunk
// order, the division, and (rotate = 1: int4-h) the rotation back, into out; os: G hd floats of
// shared memory. A thread per (head, d): it merges its element and its head's probability sum
// itself, so no barrier is needed before the division. Called by every thread of the block.
// A query with more chunks than max_chunks (positions outside the geometry the launcher sized
// the grid for) gets NaN rather than a read past its partials.
__device__ void att_merge(const float* partials, int t, int g, int n_kv, int hd, int G, int max_chunks, int pos,
                          int window, int rotate, float* os, float* out) {
    const int tid = threadIdx.x, nt = blockDim.x, lowest = att_lowest(pos, window);
    const int n_chunks = pos / TL_BLOCK / ATT_CHUNK_BLOCKS - lowest / TL_BLOCK / ATT_CHUNK_BLOCKS + 1;
    const int part = G * hd + 2 * G;
    const float* base = partials + ((long long)t * n_kv + g) * max_chunks * part;
    for (int e = tid; e < G * hd; e += nt) {
        const int h = e / hd;
        float m = ATT_NEG_INF, a = 0.0f, l = 0.0f;
        if (n_chunks > max_chunks) {
            os[e] = __int_as_float(0x7fc00000);
            continue;
        }
        // ATT_MERGE_BATCH chunks' three values are loaded before any is used (one round trip a
        // batch, not two a chunk: the merge is the tail of the launch), then merged in order
        for (int c0 = 0; c0 < n_chunks; c0 += ATT_MERGE_BATCH) {     // sass: attention-merge
            float mcs[ATT_MERGE_BATCH], acs[ATT_MERGE_BATCH], lcs[ATT_MERGE_BATCH];
#pragma unroll
            for (int j = 0; j < ATT_MERGE_BATCH; ++j) {
                if (c0 + j >= n_chunks) break;
                const float* p = base + (long long)(c0 + j) * part;
                mcs[j] = tl_load_from_other_blocks(p + G * hd + G + h);
                acs[j] = tl_load_from_other_blocks(p + e);
                lcs[j] = tl_load_from_other_blocks(p + G * hd + h);
            }
#pragma unroll
            for (int j = 0; j < ATT_MERGE_BATCH; ++j) {
                if (c0 + j >= n_chunks) break;
                const float mc = mcs[j];
                if (mc == ATT_NEG_INF) continue;                   // an empty chunk
                const float m_new = fmaxf(m, mc);
                const float corr_old = tl_exp(tl_sub(m, m_new));   // first chunk: exp(-inf) = 0
                const float corr_new = tl_exp(tl_sub(mc, m_new));
                a = tl_add(tl_mul(a, corr_old), tl_mul(acs[j], corr_new));
                l = tl_add(tl_mul(l, corr_old), tl_mul(lcs[j], corr_new));
                m = m_new;
            }
        }
        os[e] = tl_div(a, l);
    }
    if (rotate) {                          // uniform over the block: the barriers inside are safe
        __syncthreads();
        att_fwht(os, G, hd);
    }
    float* out_row = out + ((long long)t * n_kv * G + (long long)g * G) * hd;
    for (int e = tid; e < G * hd; e += nt) out_row[e] = os[e];
}

// Whether query i of the block takes part in key block b: b inside its chunk's blocks
// [lo[i], hi[i]] (hi < lo: the query has no blocks in this chunk), and, for a tree's tail block
// (staged per query), i is the query staged (`only`; -1: every query).
__device__ __forceinline__ bool att_in(const int* lo, const int* hi, int i, int b, int only) {
    return lo[i] <= b && b <= hi[i] && (only < 0 || only == i);
}

// Whether query i sees every key of block b (k0 .. k0 + 63): its sums need no mask.
__device__ __forceinline__ bool att_sees_block(const int* qpos, const int* qlow, int i, int k0) {
    return k0 >= qlow[i] && k0 + TL_BLOCK - 1 <= qpos[i];
}

// Four value columns' tree over the block's 64 keys (from v, the first column's, rows `stride`
// apart): a key's probability and one 16-byte load of its 4 values a leaf of four trees; MASKED:
// the keys past the query's visible range (low .. pos) add 0, as the one-column tree's do.
template <bool MASKED, int LEAVES>
__device__ __forceinline__ AttQuad att_quad_sums(const float* p, const float* v, int stride, int k0, int low, int pos) {
    const float* p0 = p;
    return att_tree64<LEAVES>([&](const float* pb, const float* vb) {
        // the tree's probabilities 4 to a 16-byte load (p: a (query, head)'s 64, 16-byte aligned
        // as the tiles' and the queries' sizes are multiples of 4 floats where hd is)
        float pj[LEAVES];
#pragma unroll
        for (int c = 0; c < LEAVES; c += 4) {
            const float4 p4 = *reinterpret_cast<const float4*>(pb + c);   // sass: attention-values
            pj[c] = p4.x, pj[c + 1] = p4.y, pj[c + 2] = p4.z, pj[c + 3] = p4.w;
        }
        const int j0 = MASKED ? int(pb - p0) : 0;   // the tree's first key in the block
        return AttTree<LEAVES>::sum([&](int c) {
            const bool in = !MASKED || (k0 + j0 + c >= low && k0 + j0 + c <= pos);
            const float4 vj = *reinterpret_cast<const float4*>(vb + c * stride);   // sass: attention-values
            return AttQuad{{in ? tl_mul(pj[c], vj.x) : 0.0f, in ? tl_mul(pj[c], vj.y) : 0.0f,
                            in ? tl_mul(pj[c], vj.z) : 0.0f, in ? tl_mul(pj[c], vj.w) : 0.0f}};
        }, 0);
    }, p, v, stride);
}

// acc[m] = acc[m] corr + sum[m] for a task's 4 value columns.
__device__ __forceinline__ void att_rescale_add4(float* acc, float corr, const AttQuad& sum) {
#pragma unroll
    for (int m = 0; m < 4; ++m) acc[m] = tl_add(tl_mul(acc[m], corr), sum.v[m]);
}

// The value sums of the (query, head)s that see the whole block, 4 columns a thread, no mask.
template <int LEAVES>
__device__ __forceinline__ void att_values_whole(const float* ps, const float* vtile, float* part, const float* corr,
                                                 const int* skip, const int* lo, const int* hi, const int* qpos,
                                                 const int* qlow, int nq, int G, int hd, int stride, int b, int only) {
    const int k0 = b * TL_BLOCK, part_size = G * hd + 2 * G, per_head = hd / 4, tasks = G * per_head;
    for (int x = threadIdx.x; x < nq * tasks; x += blockDim.x) {
        const int i = x / tasks, o = x % tasks, h = o / per_head, w = i * G + h;
        if (!att_in(lo, hi, i, b, only) || skip[w] || !att_sees_block(qpos, qlow, i, k0)) continue;
        const AttQuad sum = att_quad_sums<false, LEAVES>(ps + w * TL_BLOCK, vtile + 4 * (o - h * per_head), stride, k0, 0, 0);
        att_rescale_add4(part + i * part_size + 4 * o, corr[w], sum);
    }
}

// The rest: the value columns of the (query, head)s that see part of the block (4 columns a
// thread, masked), or where hd is not a multiple of 4 every (query, head)'s (a column a thread,
// masked); then per (query, head) the sum of p (masked: all true where it sees the whole block,
// the same sum).
template <int LEAVES>
__device__ __forceinline__ void att_values_rest(const float* ps, const float* vtile, float* part, const float* corr,
                                                const int* skip, const int* lo, const int* hi, const int* qpos,
                                                const int* qlow, int nq, int G, int hd, int stride, int b, int only,
                                                bool quads) {
    const int k0 = b * TL_BLOCK, part_size = G * hd + 2 * G, width = quads ? 4 : 1, per_head = hd / width;
    const int tasks = G * per_head + G;
    for (int x = threadIdx.x; x < nq * tasks; x += blockDim.x) {
        const int i = x / tasks, o = x % tasks;
        if (!att_in(lo, hi, i, b, only)) continue;
        const bool columns = o < G * per_head;
        if (columns && quads && att_sees_block(qpos, qlow, i, k0)) continue;   // att_values_whole's
        const int h = columns ? o / per_head : o - G * per_head, w = i * G + h;
        if (skip[w]) continue;
        const float* p = ps + w * TL_BLOCK;
        const int low = qlow[i], pos = qpos[i];
        float* acc = part + i * part_size;
        if (columns && quads) {
            att_rescale_add4(acc + 4 * o, corr[w], att_quad_sums<true, LEAVES>(p, vtile + 4 * (o - h * per_head), stride, k0, low, pos));
        } else if (columns) {
            const float* v = vtile + (o - h * per_head);
            const float sum = AttTree<TL_BLOCK>::sum([&](int j) {
                return (k0 + j >= low && k0 + j <= pos) ? tl_mul(p[j], v[j * stride]) : 0.0f; }, 0);
            acc[o] = tl_add(tl_mul(acc[o], corr[w]), sum);
        } else {
            const float sum = AttTree<TL_BLOCK>::sum([&](int j) {
                return (k0 + j >= low && k0 + j <= pos) ? p[j] : 0.0f; }, 0);
            acc[G * hd + h] = tl_add(tl_mul(acc[G * hd + h], corr[w]), sum);
        }
    }
}

// One 64-key block b, its keys staged in ktile (and its values in vtile, or staged there by
// stage_values once the scores are taken: one tile), for the block's queries that take part in
// it: scores, the online softmax and the value sums, each query and head exactly as alone (the
// twin's order). Called by every thread; ends on a barrier. LEAVES: the value trees' keys
// (AttTreeLeaves).
template <int LEAVES, class StageValues>
__device__ void att_block_step(const float* qs, const float* ktile, const float* vtile, float* ps, float* part,
                               float* corr, int* skip, const int* lo, const int* hi, const int* qpos,
                               const int* qlow, int nq, int G, int hd, int stride, int b, int only,
                               const StageValues& stage_values) {
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, n_warps = nt >> 5;
    const int k0 = b * TL_BLOCK, part_size = G * hd + 2 * G;
    // quads: hd a multiple of 4 (the stride too, att_tile_stride), uniform over the launch: the
    // sums take 16-byte shared loads, four elements each (the same products and sums)
    const bool quads = hd % 4 == 0;
    // scores (query, head, key): a thread each
    for (int p = tid; p < nq * G * TL_BLOCK; p += nt) {
        const int i = p / (G * TL_BLOCK), h = p / TL_BLOCK % G, j = p % TL_BLOCK, k = k0 + j;
        if (!att_in(lo, hi, i, b, only)) continue;
        const float* qh = qs + (i * G + h) * hd;
        const float* kj = ktile + j * stride;
        ps[p] = (k >= qlow[i] && k <= qpos[i]) ? (quads ? att_dot4(qh, kj, hd) : att_dot(qh, kj, hd)) : ATT_NEG_INF;
    }
    __syncthreads();
    // online softmax: a warp per (query, head), each lane two keys (lane, lane + 32)
    for (int w = warp; w < nq * G; w += n_warps) {
        const int i = w / G, h = w % G;
        if (!att_in(lo, hi, i, b, only)) continue;                 // uniform over the warp
        float* m_row = part + i * part_size + G * hd + G;          // (G,) running max
        float a = ps[w * TL_BLOCK + lane], c = ps[w * TL_BLOCK + lane + 32];
        float m_old = m_row[h];
        float bm = tl_warp_max(fmaxf(a, c));
        bool empty = bm == ATT_NEG_INF;
        __syncwarp();                      // every lane has read the max before lane 0 rewrites it
        if (!empty) {
            float m_new = fmaxf(m_old, bm);
            ps[w * TL_BLOCK + lane] = tl_exp(tl_sub(a, m_new));            // masked: exp(-inf) = 0
            ps[w * TL_BLOCK + lane + 32] = tl_exp(tl_sub(c, m_new));
            if (lane == 0) {
                m_row[h] = m_new;
                corr[w] = tl_exp(tl_sub(m_old, m_new));                    // first block: exp(-inf) = 0
            }
        }
        if (lane == 0) skip[w] = empty;
    }
    stage_values();                        // one tile: the keys were last read before the barrier above
    __syncthreads();                       // the probabilities (and the values) are written
    // acc = acc * corr + tree_j(p_j v_j): a thread per (query, head, 4 columns) (per column
    // where hd is not a multiple of 4), then per (query, head) the sum of p. Two passes: first
    // the (query, head)s that see all 64 keys of the block (every block of a query but its
    // first and last), whose trees take no mask, then the rest; the same products and sums.
    // No barrier between them: each writes its own elements of part
    if (quads) att_values_whole<LEAVES>(ps, vtile, part, corr, skip, lo, hi, qpos, qlow, nq, G, hd, stride, b, only);
    att_values_rest<LEAVES>(ps, vtile, part, corr, skip, lo, hi, qpos, qlow, nq, G, hd, stride, b, only, quads);
    __syncthreads();
}

// Pass 1 for queries t0 .. t0 + nq - 1 (nq <= qb; qb > 1 only without a window or ring, when
// every query's chunk z is the same absolute blocks), kv head g, chunk z.
template <int MODE, bool ROTATE>
__device__ void attention_impl(float* att_smem, const float* q, int q_stride, KVSide keys, KVSide values,
                               const int* blocks, int n_kv, int n_rows, int hd, int group, const int* positions,
                               int window,
                               int ring_blocks, const int* shared_end, const int* tail_rows, int tail_len,
                               int has_tail, float scale, float* partials, int max_chunks, int vector,
                               unsigned int* counters, float* out, int n_queries, int qb, int tiles,
                               const float* rotation, int has_rotation, const int* table_offsets,
                               int per_token_tables) {
    const int t0 = blockIdx.x * qb, g = blockIdx.y, z = blockIdx.z, G = group, tid = threadIdx.x, nt = blockDim.x;
    const int nq = n_queries - t0 < qb ? n_queries - t0 : qb;
    const int stride = att_tile_stride(hd);   // a multiple of 4 where hd is, else odd
    const int part_size = G * hd + 2 * G;
    // tiles = 2: keys and values staged together; 1 (a device whose shared memory cannot hold
    // two at this head size): the values replace the keys once the scores are taken
    float* ktile = att_smem;               // (64, stride) the block's keys
    float* vtile = tiles == 2 ? ktile + TL_BLOCK * stride : ktile;  // (64, stride) its values
    float* qs = ktile + tiles * TL_BLOCK * stride;  // (qb, G, hd) the queries, rotated and scaled
    float* ps = qs + qb * G * hd;          // (qb, G, 64) scores, then probabilities
    float* part = ps + qb * G * TL_BLOCK;  // (qb, G hd + 2 G) per query: value sums, probability sums, max
    float* corr = part + qb * part_size;   // (qb, G) this block's correction exp(m - m')
    int* skip = (int*)(corr + qb * G);     // (qb, G) 1: the block has no visible key for this head
    int* qpos = skip + qb * G;             // (qb,) position
    int* qlow = qpos + qb;                 // (qb,) lowest visible position
    int* lo = qlow + qb;                   // (qb,) the query's first and last key block in chunk z
    int* hi = lo + qb;
    int* flags = hi + qb;                  // (qb,) the query's merge falls to this block
    int* range = flags + qb;               // (2,) the blocks any query takes part in

    if (tid == 0) {
        int b_begin = 1 << 30, b_end = -1;
        for (int i = 0; i < nq; ++i) {
            const int pos = positions[t0 + i], lowest = att_lowest(pos, window);
            const int first = lowest / TL_BLOCK, last = pos / TL_BLOCK;
            const int chunk = first / ATT_CHUNK_BLOCKS + z;       // clipped to the query's own blocks
            const int c0 = chunk * ATT_CHUNK_BLOCKS, c1 = c0 + ATT_CHUNK_BLOCKS - 1;
            qpos[i] = pos;
            qlow[i] = lowest;
            lo[i] = c0 > first ? c0 : first;
            hi[i] = chunk > last / ATT_CHUNK_BLOCKS ? -1 : (c1 < last ? c1 : last);   // past its last chunk: none
            if (lo[i] <= hi[i]) {
                b_begin = lo[i] < b_begin ? lo[i] : b_begin;
                b_end = hi[i] > b_end ? hi[i] : b_end;
            }
        }
        range[0] = b_begin;
        range[1] = b_end;
    }
    __syncthreads();
    const int b_begin = range[0], b_end = range[1];
    if (b_end < b_begin) return;           // no query has this chunk: the whole block leaves

    AttGeometry geo;                       // the rows staged: every taking-part query's (see below)
    geo.ring_blocks = ring_blocks;
    geo.shared_end = *shared_end;          // on the device: a replayed verify graph's rounds differ
    geo.tail_rows = tail_rows;
    geo.tail_len = tail_len;
    geo.has_tail = has_tail;
    // several caches' queries in one launch (a batched step): query t's block table row starts
    // at blocks + table_offsets[t], and the launcher gives such a launch one query a block
    geo.blocks = per_token_tables ? blocks + table_offsets[t0] : blocks;
    const long long plane = g;

    // the queries, by pairs; has_rotation (RoPE fused, one launch fewer per layer): each pair
    // (a, b) rotated by its query's (c, d) = rotation[t, 2i], [t, 2i + 1] as elementwise.cu's
    // rope_rows does it, (a c - b d, a d + b c), before anything else touches it
    for (int e2 = tid; e2 < nq * G * hd / 2; e2 += nt) {
        const int e = 2 * e2, i = e / (G * hd), within = e % (G * hd);
        const float* qe = q + (long long)(t0 + i) * q_stride + (long long)g * G * hd + within;
        const float a = qe[0], b = qe[1];
        if (has_rotation) {
            const float* rot = rotation + (long long)(t0 + i) * hd + within % hd;
            const float c = rot[0], d = rot[1];
            qs[e] = tl_sub(tl_mul(a, c), tl_mul(b, d));
            qs[e + 1] = tl_add(tl_mul(a, d), tl_mul(b, c));
        } else {
            qs[e] = a;
            qs[e + 1] = b;
        }
    }
    for (int e = tid; e < nq * part_size; e += nt)
        part[e] = e % part_size < G * hd + G ? 0.0f : ATT_NEG_INF;            // acc, l = 0; m = -inf
    __syncthreads();
    if (ROTATE) att_fwht(qs, nq * G, hd);
    for (int e = tid; e < nq * G * hd; e += nt) qs[e] = tl_mul(qs[e], scale);
    __syncthreads();

    const int first_sides = tiles == 2 ? ATT_KEYS | ATT_VALUES : ATT_KEYS;
    int b = 0;                             // the block being summed, for stage_values
    auto stage_values = [&]() {
        if (tiles == 1) att_stage<MODE>(keys, values, ktile, vtile, stride, plane, n_rows, hd, b, geo, vector,
                                        ATT_VALUES);
    };
    for (b = b_begin; b <= b_end; ++b) {
        if (has_tail && b >= geo.shared_end) {
            // a tree's tail block: each query's path rows are its own, staged and summed one
            // query at a time
            for (int i = 0; i < nq; ++i) {
                if (!att_in(lo, hi, i, b, -1)) continue;          // uniform: every thread reads the same
                geo.t = t0 + i;
                geo.pos = qpos[i];
                geo.lowest = qlow[i];
                att_stage<MODE>(keys, values, ktile, vtile, stride, plane, n_rows, hd, b, geo, vector, first_sides);
                __syncthreads();
                att_block_step<AttTreeLeaves<MODE>::value>(qs, ktile, vtile, ps, part, corr, skip, lo, hi, qpos, qlow, nq, G, hd, stride, b, i,
                               stage_values);
            }
            continue;
        }
        // the rows any taking-part query sees (each query masks its own in the sums)
        geo.t = t0;
        geo.pos = -1;
        geo.lowest = 1 << 30;
        for (int i = 0; i < nq; ++i) {
            if (!att_in(lo, hi, i, b, -1)) continue;
            geo.pos = qpos[i] > geo.pos ? qpos[i] : geo.pos;
            geo.lowest = qlow[i] < geo.lowest ? qlow[i] : geo.lowest;
        }
        att_stage<MODE>(keys, values, ktile, vtile, stride, plane, n_rows, hd, b, geo, vector, first_sides);
        __syncthreads();
        att_block_step<AttTreeLeaves<MODE>::value>(qs, ktile, vtile, ps, part, corr, skip, lo, hi, qpos, qlow, nq, G, hd, stride, b, -1,
                       stage_values);
    }

    // the loop ended on a barrier: every query's sums are final. partials[t, g, z] = (acc, l, m)
    for (int e = tid; e < nq * part_size; e += nt) {
        const int i = e / part_size;
        if (lo[i] > hi[i]) continue;                              // no blocks of its in this chunk
        partials[(((long long)(t0 + i) * n_kv + g) * max_chunks + z) * part_size + e % part_size] = part[e];
    }
    if (counters == nullptr) return;       // two launches: attention_merge merges

    // The merge folded in: the last of a query's chunk blocks to finish merges every chunk, in
    // the fixed order, into out (the arithmetic of attention_merge). Each block's fence puts its
    // partials in memory before its counts; the block that brings a query's count to its
    // n_chunks (the chunk blocks that write one) resets it for the next launch (or a replayed
    // graph) and merges that query.
    __threadfence();
    __syncthreads();                       // every thread's partials are written and fenced
    if (tid == 0) {
        for (int i = 0; i < nq; ++i) {
            flags[i] = 0;
            if (lo[i] > hi[i]) continue;
            const int first = qlow[i] / TL_BLOCK, last = qpos[i] / TL_BLOCK;
            const int n_chunks = last / ATT_CHUNK_BLOCKS - first / ATT_CHUNK_BLOCKS + 1;
            const unsigned int expected = (unsigned int)(n_chunks < max_chunks ? n_chunks : max_chunks);
            unsigned int* counter = counters + (long long)(t0 + i) * n_kv + g;
            const bool last_block = atomicAdd(counter, 1u) + 1u == expected;
            if (last_block) *counter = 0u;
            flags[i] = last_block;
        }
    }
    __syncthreads();
    bool fenced = false;
    for (int i = 0; i < nq; ++i) {
        if (!flags[i]) continue;           // uniform over the block
        if (!fenced) __threadfence();
        fenced = true;
        att_merge(partials, t0 + i, g, n_kv, hd, G, max_chunks, qpos[i], window, ROTATE, qs + i * G * hd, out);
    }
}

// The dynamic shared array is declared outside the templates: the CPU harness (tests/cudasim)
// only resolves `extern __shared__` declared outside templates.
extern __shared__ __align__(16) float att_smem[];

#define ATT_TAIL_ARGS const int* blocks, int n_kv, int n_rows, int hd, int group, const int* positions, int window, \
    int ring_blocks, const int* shared_end, const int* tail_rows, int tail_len, int has_tail, float scale, \
    float* partials, int max_chunks, int vector, unsigned int* counters, int merge, float* out, int n_queries, \
    int qb, int tiles, const float* rotation, int has_rotation, const int* table_offsets, int per_token_tables
#define ATT_TAIL_PASS blocks, n_kv, n_rows, hd, group, positions, window, ring_blocks, shared_end, \
    tail_rows, tail_len, has_tail, scale, partials, max_chunks, vector, merge ? counters : nullptr, out, \
    n_queries, qb, tiles, rotation, has_rotation, table_offsets, per_token_tables
// Kernel headers are written out (not generated by a macro): the CPU harness finds kernels in the source text.
extern "C" __global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS) attention_fp32(const float* q, int q_stride, const float* key_data,
                                          const float* value_data, ATT_TAIL_ARGS) {
    tl_dependent_launch();
    attention_impl<ATT_FP32, false>(att_smem, q, q_stride, KVSide{key_data, nullptr, nullptr},
                                    KVSide{value_data, nullptr, nullptr}, ATT_TAIL_PASS);
}
extern "C" __global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS) attention_fp16(const float* q, int q_stride, const __half* key_data,
                                          const __half* value_data, ATT_TAIL_ARGS) {
    tl_dependent_launch();
    attention_impl<ATT_FP16, false>(att_smem, q, q_stride, KVSide{key_data, nullptr, nullptr},
                                    KVSide{value_data, nullptr, nullptr}, ATT_TAIL_PASS);
}
#define ATT_INT_ARGS const float* q, int q_stride, const unsigned char* key_codes, const __half* key_scale, \
    const __half* key_min, const unsigned char* value_codes, const __half* value_scale, const __half* value_min
#define ATT_INT_SIDES KVSide{key_codes, key_scale, key_min}, KVSide{value_codes, value_scale, value_min}
extern "C" __global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS) attention_int8(ATT_INT_ARGS, ATT_TAIL_ARGS) {
    tl_dependent_launch();
    attention_impl<ATT_INT8, false>(att_smem, q, q_stride, ATT_INT_SIDES, ATT_TAIL_PASS);
}
extern "C" __global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS) attention_int4(ATT_INT_ARGS, ATT_TAIL_ARGS) {
    tl_dependent_launch();
    attention_impl<ATT_INT4, false>(att_smem, q, q_stride, ATT_INT_SIDES, ATT_TAIL_PASS);
}
extern "C" __global__ void __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS) attention_int4h(ATT_INT_ARGS, ATT_TAIL_ARGS) {
    tl_dependent_launch();
    attention_impl<ATT_INT4, true>(att_smem, q, q_stride, ATT_INT_SIDES, ATT_TAIL_PASS);
}

// Pass 2 (when pass 1 does not merge): attention_merge, one block per (query t, kv head g).
extern "C" __global__ void attention_merge(const float* partials, int n_kv, int hd, int group, int max_chunks,
                                           const int* positions, int window, int rotate, float* out) {
    tl_dependent_launch();
    att_merge(partials, blockIdx.x, blockIdx.y, n_kv, hd, group, max_chunks, positions[blockIdx.x], window, rotate,
              att_smem, out);
}
