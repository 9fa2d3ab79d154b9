// Sampling support on the device: greedy ids, top-k candidates, log-normalizers, so a
// decode step moves T ids or T x k candidates to the host instead of T x V logits.
// Twin: tinyloop/backends/reference/twins/sampling.py. Launch: launch/sampling.py.
//
// Ranking. Every logit gets a 64-bit rank key: the float's order key in the high word
// (larger value -> larger key; -0 counts as +0; every NaN ranks above +inf, as in np.argmax
// and np.sort), 0xFFFFFFFF - id in the low word (ties go to the lower id). Keys are
// distinct within a row, so "the k largest keys" is one exact set whatever the thread
// order: argmax is the largest key, top-k the k largest in descending order, which is
// tinyloop.backends.reference.topk.top_k_ids on NaN-free rows.
#include "common.cuh"

#define TL_ROW_THREADS 256                   // argmax_rows, logsumexp_rows
#define TL_TOPK_THREADS 512                  // top_k_rows
#define TL_TOPK_MAX 64                       // the largest k top_k_rows supports

__device__ __forceinline__ unsigned long long tl_rank_key(float v, int id) {
    unsigned bits = __float_as_uint(v);
    unsigned key;
    if (v != v) key = 0xFFFFFFFFu;                       // NaN: above +inf (0xFF800000)
    else {
        if (bits == 0x80000000u) bits = 0u;              // -0 ties with +0
        key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    }
    return ((unsigned long long)key << 32) | (0xFFFFFFFFu - (unsigned)id);
}

__device__ __forceinline__ int tl_rank_id(unsigned long long key) {
    return (int)(0xFFFFFFFFu - (unsigned)(key & 0xFFFFFFFFu));
}

// The largest key over the block (max is order-free); `slots` holds one key per warp.
__device__ unsigned long long tl_block_max_key(unsigned long long key, unsigned long long* slots) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        unsigned long long other = __shfl_xor_sync(TL_FULL_MASK, key, offset);
        key = other > key ? other : key;
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    if (lane == 0) slots[warp] = key;
    __syncthreads();
    key = slots[0];
    for (int w = 1; w < warps; w++) key = slots[w] > key ? slots[w] : key;
    __syncthreads();
    return key;
}

// logits: (T, V), out_ids: (T,). One block of TL_ROW_THREADS per row.
extern "C" __global__ void __launch_bounds__(TL_ROW_THREADS)
argmax_rows(const float* logits, int T, int V, int* out_ids) {
    tl_dependent_launch();
    __shared__ unsigned long long slots[TL_ROW_THREADS / 32];
    const float* row = logits + (long long)blockIdx.x * V;
    unsigned long long best = 0;                         // below every real key
    for (int i = threadIdx.x; i < V; i += TL_ROW_THREADS) {
        unsigned long long key = tl_rank_key(row[i], i);
        best = key > best ? key : best;
    }
    best = tl_block_max_key(best, slots);
    if (threadIdx.x == 0) out_ids[blockIdx.x] = tl_rank_id(best);
}

// logits: (T, V), out: (T,) float64 = m + log(sum exp(x - m)) in double, m the row's max
// (NaN if the row holds one, so the result is NaN; an infinite m gives NaN, as NumPy).
// Thread-strided partial sums, then a fixed shared-memory tree.
extern "C" __global__ void __launch_bounds__(TL_ROW_THREADS)
logsumexp_rows(const float* logits, int T, int V, double* out) {
    tl_dependent_launch();
    __shared__ unsigned long long slots[TL_ROW_THREADS / 32];
    __shared__ double sums[TL_ROW_THREADS];
    const float* row = logits + (long long)blockIdx.x * V;
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < V; i += TL_ROW_THREADS) {
        unsigned long long key = tl_rank_key(row[i], i);
        best = key > best ? key : best;
    }
    double top = (double)row[tl_rank_id(tl_block_max_key(best, slots))];
    double partial = 0.0;
#pragma unroll 1                                          // unrolled, exp's slow path spills 8 bytes
    for (int i = threadIdx.x; i < V; i += TL_ROW_THREADS) partial += exp((double)row[i] - top);
    sums[threadIdx.x] = partial;
    __syncthreads();
    for (int half = TL_ROW_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = top + log(sums[0]);
}

// logits: (T, V), out_ids / out_values: (T, k), 1 <= k <= min(V, 64): the k largest rank
// keys of each row, best first. One block per row, any multiple of 32 threads up to
// TL_TOPK_THREADS (the result does not depend on it).
//
// Radix select on the 64-bit key, 8 bits a pass from the top: count the digits of the
// keys that still match the chosen prefix (shared-memory histogram; integer atomics,
// so the counts do not depend on thread order), pick the bucket holding the k-th
// largest key, repeat. It stops as soon as the chosen bucket's keys are all wanted; the
// id digits above the highest bit of V - 1 are constant and skipped. Then one pass
// gathers the exactly k keys at or above the prefix (in any order) and each is placed
// by its rank among them. Each pass reads the row once: at most 4 value passes, up to
// 3 id passes (only on ties at the k-th value; V <= 2^24), one gather.
extern "C" __global__ void __launch_bounds__(TL_TOPK_THREADS)
top_k_rows(const float* logits, int T, int V, int k, int* out_ids, float* out_values) {
    tl_dependent_launch();
    __shared__ unsigned hist[256];
    __shared__ unsigned long long picked[TL_TOPK_MAX];
    __shared__ unsigned choice[3];                        // bucket, rank left, bucket count
    __shared__ unsigned n_picked;
    // Set before the first pass's barriers: after the passes another warp may still be reading
    // choice[], which the compiler loads with n_picked in one 16-byte load (racecheck on an
    // H200 flagged the write there against that read).
    if (threadIdx.x == 0) n_picked = 0u;
    const float* row = logits + (long long)blockIdx.x * V;
    const int lane = threadIdx.x & 31;
    int id_bits = 0;
    while (id_bits < 32 && ((unsigned)(V - 1) >> id_bits) != 0u) id_bits++;
    int id_top = (id_bits + 7) & ~7;                      // id digits at or above this are constant

    unsigned long long prefix = 0, mask = 0;              // the chosen digits so far
    unsigned wanted = (unsigned)k;                        // rank of the k-th key among the prefix's keys
    for (int shift = 56; shift >= 0; shift -= 8) {
        if (shift < 32 && shift >= id_top) continue;
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0u;
        __syncthreads();
        // Lanes holding the same digit add once (warp-aggregated): the first passes put
        // nearly every key in one or two buckets, where per-key shared atomics serialize.
        for (int base = threadIdx.x - lane; base < V; base += blockDim.x) {   // warp-uniform trips
            int i = base + lane;
            unsigned digit = 256u;                                  // counts nowhere
            if (i < V) {
                unsigned long long key = tl_rank_key(row[i], i);
                if ((key & mask) == prefix) digit = (unsigned)(key >> shift) & 255u;
            }
            unsigned peers = __match_any_sync(TL_FULL_MASK, digit);
            if (digit < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], (unsigned)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l owns buckets 255 - 8l down to 248 - 8l; a lane scan finds the lane
            // whose buckets the wanted rank falls in, which walks them from the top.
            unsigned own = 0;
            for (int j = 0; j < 8; j++) own += hist[255 - 8 * lane - j];
            unsigned through = own;                       // keys in lanes 0..lane's buckets
            for (int offset = 1; offset < 32; offset <<= 1) {
                unsigned before = __shfl_up_sync(TL_FULL_MASK, through, offset);
                if (lane >= offset) through += before;
            }
            unsigned above = through - own;
            if (above < wanted && wanted <= through) {
                for (int j = 0; j < 8; j++) {
                    unsigned bucket = 255 - 8 * lane - j, count = hist[bucket];
                    if (above + count >= wanted) {
                        choice[0] = bucket; choice[1] = wanted - above; choice[2] = count;
                        break;
                    }
                    above += count;
                }
            }
        }
        __syncthreads();
        prefix |= (unsigned long long)choice[0] << shift;
        mask |= 0xFFull << shift;
        wanted = choice[1];
        // Every key in the bucket is wanted: stop. (No barrier before the next pass clears
        // hist and rewrites choice: warp 0 read hist before the barrier above, and choice is
        // written only after two more barriers, which every thread reaches after reading it.)
        if (choice[2] == wanted) break;
    }

    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        unsigned long long key = tl_rank_key(row[i], i);
        if ((key & mask) >= prefix) {
            unsigned slot = atomicAdd(&n_picked, 1u);
            if (slot < TL_TOPK_MAX) picked[slot] = key;
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < k; t += blockDim.x) {
        unsigned long long key = picked[t];
        int rank = 0;
        for (int j = 0; j < k; j++) rank += picked[j] > key;
        int id = tl_rank_id(key);
        out_ids[(long long)blockIdx.x * k + rank] = id;
        out_values[(long long)blockIdx.x * k + rank] = row[id];
    }
}
