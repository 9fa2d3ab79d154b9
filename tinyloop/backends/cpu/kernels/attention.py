"""Attention of each query over the backend's own KV storage: one compiled kernel for every
path (prefill, decode, draft, verify, tree) and every KV mode.

The arithmetic of one query (position pos, window lowest = max(pos - W + 1, 0) or 0), per
query head, is fixed by the query's own inputs and logical positions alone:

    q' = q (int4-h: fwht(q), rotation.py) * scale                 float32, elementwise
    keys are visited in blocks of BLOCK = 64 logical positions, b = lowest // 64 .. pos // 64,
    and the blocks in chunks of CHUNK_BLOCKS = 4: chunk c is the logical blocks
    [4c, 4c + 4) clipped to the query's range.
    per chunk, from m = -inf, l = +0, acc = +0, per block in increasing order:
        s_j = q' . k_j for the 64 keys j of the block: lanes.dot16 (16 lanes from +0, lane
              i adding the products of d = i, i + 16, ... in increasing d, then the fixed
              tree 8, 4, 2, 1); a key outside [lowest, pos] gets s_j = -inf, unread
        bm = max_j s_j (16 lanes of running maxima, then lane 0..15 in order; a max is
              exact, the order only decides between -0 and +0, which changes nothing below)
        a block with bm = -inf (no visible key; never one in a query's range) changes nothing
        m' = max(m, bm); alpha = exp(m - m'); p_j = exp(s_j - m')     (masked: exactly +0)
        bl = the 64 p_j in 16 lanes (lane i: p_i, + p_{i+16}, + p_{i+32}, + p_{i+48}), tree
        bacc[d] = +0 + p_0 v_0[d] + p_1 v_1[d] + ... + p_63 v_63[d], in j order, a term with
              p_j = 0 left out (a no-op anyway on a sum that starts at +0, which is never
              -0; so a masked row's contents, NaN included, are never used)
        acc = acc * alpha + bacc; l = l * alpha + bl; m = m'
    merge, from M = -inf, L = +0, A = +0, per chunk of the query's range in increasing
    order (a chunk with m = -inf is skipped):
        M' = max(M, m); a = exp(M - M'); b = exp(m - M'); A = A a + acc b; L = L a + l b; M = M'
    out = A / L (int4-h: then fwht(out))

Why no call, thread or CPU can change a bit: exp is fmath.exp_f32 (no libm); numba
compiles without fast-math, so LLVM may neither reassociate nor contract a multiply and
an add into an FMA; the two hand-written IR kernels (dot16, the block's p . v) use plain
fmul/fadd on <16 x float> vectors, which any target (AVX-512, AVX2's 2 x 8, SSE's 4 x 4,
NEON) executes element by element in the written order. Vectorisation runs across
independent lanes, keys or d, never across a reduction. A key's logical position alone
decides its block, chunk and lane, whatever physical row holds it (a ring's wrap, a
draft tree's path), so a tree node sees the very sequence a sequential decode of its
path sees. Threads split the work by (tile of queries, kv head) or by (tile, chunk, kv
head); a tile only shares the loading of a block (the dequantization), each query keeps
its own state, and a chunk's state is the same expression whichever thread computes it;
the merge is the same sequence in both drivers (_attend_rows inline, _attend_chunks +
_merge_chunks through a scratch array). So how many queries share a call, which others
are in it, whether it is a prefill (bulk plan) or a decode / verify (exact plan), the
tile size, the driver and the thread count never change a query's output
(tests/test_cpu_attention_kernels.py checks each of these against the NumPy oracle,
attention_oracle.py).

Quantized modes are dequantized per 64-row block inside the kernel into a (64, hd)
float32 scratch (code * scale + min, float32 multiply then add, as IntStore.dequantize),
never into a float copy of the cache; float16 scales are widened from their bits exactly.
The fp16 mode's half bits are widened exactly into the same scratch; fp32 is read in place.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.extending import intrinsic

from tinyloop.backends.cpu.kernels.fmath import exp_f32
from tinyloop.backends.cpu.kernels.rotation import fwht_row
from tinyloop.backends.cpu.kernels.simd import fadd, fmul, load_codes8_f32, load_group8, splat_f32, store_f32x8

F = np.float32
BLOCK = 64                       # tinyloop.limits.ATTENTION_BLOCK
CHUNK_BLOCKS = 4                 # blocks per chunk: the unit of the merge and of thread splits
CHUNK_ROWS = BLOCK * CHUNK_BLOCKS
LANES = 16
NO_TREE = 1 << 62                # shared_end without a draft tree
NEG_INF = F(-np.inf)
MINUS_ZERO = F(-0.0)
POW2_112 = F(2.0 ** 112)


@intrinsic
def _i32_as_f32(typingctx, bits):
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return sig, codegen


@njit(inline="always", cache=True)
def half_to_f32(h):
    """A float16's bits (uint16) -> its float32 value, exactly (subnormals, inf and NaN too)."""
    u = np.int32(h)
    mag = (u & 0x7FFF) << 13
    f = _i32_as_f32(np.int32(mag)) * POW2_112          # exact: a power-of-two rescaling of the exponent
    if (u & 0x7C00) == 0x7C00:
        f = _i32_as_f32(np.int32(mag | 0x7F800000))
    return -f if (u & 0x8000) else f


@njit(inline="always", cache=True)
def _tree16(lane):
    for width in (8, 4, 2, 1):
        for i in range(width):
            lane[i] = lane[i] + lane[i + width]
    return lane[0]


def _dot16_codegen(n_chunks):
    """LLVM IR of lanes.dot16 over 16 * n_chunks floats (n_chunks None: a runtime argument):
    a <16 x float> accumulator from +0 adding a[16c:16c+16] * b[16c:16c+16] for c in order,
    then the fixed tree (8, 4, 2, 1). Plain fmul/fadd without fast-math flags: IEEE
    operations in this order on every target (wider or narrower vectors are split
    element by element)."""
    def codegen(context, builder, signature, args):
        aty, bty = signature.args[0], signature.args[2]
        a_data = context.make_array(aty)(context, builder, args[0]).data
        b_data = context.make_array(bty)(context, builder, args[2]).data
        f32 = ir.FloatType()
        vec = ir.VectorType(f32, LANES)
        vptr = vec.as_pointer()
        i64 = ir.IntType(64)
        pa = builder.gep(a_data, [args[1]])
        pb = builder.gep(b_data, [args[3]])

        def product(offset):
            x = builder.load(builder.bitcast(builder.gep(pa, [offset]), vptr), align=4)
            y = builder.load(builder.bitcast(builder.gep(pb, [offset]), vptr), align=4)
            return builder.fmul(x, y)

        acc = ir.Constant(vec, [0.0] * LANES)
        if n_chunks is not None:
            for c in range(n_chunks):
                acc = builder.fadd(acc, product(ir.Constant(i64, LANES * c)))
        else:
            n = args[4]
            entry = builder.block
            loop = builder.append_basic_block("dot16.loop")
            done = builder.append_basic_block("dot16.done")
            zero = ir.Constant(n.type, 0)
            builder.cbranch(builder.icmp_signed(">", n, zero), loop, done)
            builder.position_at_end(loop)
            phi_acc = builder.phi(vec)
            phi_c = builder.phi(n.type)
            phi_acc.add_incoming(acc, entry)
            phi_c.add_incoming(zero, entry)
            new_acc = builder.fadd(phi_acc, product(builder.mul(phi_c, ir.Constant(n.type, LANES))))
            new_c = builder.add(phi_c, ir.Constant(n.type, 1))
            phi_acc.add_incoming(new_acc, loop)
            phi_c.add_incoming(new_c, loop)
            builder.cbranch(builder.icmp_signed("<", new_c, n), loop, done)
            builder.position_at_end(done)
            result = builder.phi(vec)
            result.add_incoming(acc, entry)
            result.add_incoming(new_acc, loop)
            acc = result
        v, width = acc, LANES // 2
        while width >= 1:
            index = ir.VectorType(ir.IntType(32), width)
            low = builder.shuffle_vector(v, v, ir.Constant(index, list(range(width))))
            high = builder.shuffle_vector(v, v, ir.Constant(index, list(range(width, 2 * width))))
            v = builder.fadd(low, high)
            width //= 2
        return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))
    return codegen


def _fixed_dot(n_chunks):
    @intrinsic
    def dot(typingctx, a, a_offset, b, b_offset):
        return types.float32(a, types.intp, b, types.intp), _dot16_codegen(n_chunks)
    return dot


_dot16x1, _dot16x2, _dot16x4, _dot16x8 = (_fixed_dot(n) for n in (1, 2, 4, 8))


@intrinsic
def _dot16xn(typingctx, a, a_offset, b, b_offset, n_chunks):
    return types.float32(a, types.intp, b, types.intp, types.intp), _dot16_codegen(None)


def _pv_codegen(n_chunks):
    """LLVM IR of one block's probability . value sum for one query head, hd = 16 * n_chunks:
    acc (n_chunks <16 x float>, from +0) += p[p_off + j] * values[v_off[j] + 16c:+16] for
    j = 0..63 in order, a term whose p is 0 replaced by +0 (so it adds nothing, and a
    masked row's contents are never used), then stored to out[out_off:+hd]. The
    accumulators stay in registers; each element's sum is the scalar loop's."""
    def codegen(context, builder, signature, args):
        out_ty, _, p_ty, _, v_ty, off_ty = signature.args
        out_data = context.make_array(out_ty)(context, builder, args[0]).data
        p_data = context.make_array(p_ty)(context, builder, args[2]).data
        v_data = context.make_array(v_ty)(context, builder, args[4]).data
        off_data = context.make_array(off_ty)(context, builder, args[5]).data
        f32 = ir.FloatType()
        vec = ir.VectorType(f32, LANES)
        vptr = vec.as_pointer()
        i64 = ir.IntType(64)
        zero = ir.Constant(vec, [0.0] * LANES)
        out_ptr = builder.gep(out_data, [args[1]])
        p_ptr = builder.gep(p_data, [args[3]])
        entry = builder.block
        loop = builder.append_basic_block("pv.loop")
        done = builder.append_basic_block("pv.done")
        builder.branch(loop)
        builder.position_at_end(loop)
        j = builder.phi(i64)
        j.add_incoming(ir.Constant(i64, 0), entry)
        accs = []
        for c in range(n_chunks):
            phi = builder.phi(vec)
            phi.add_incoming(zero, entry)
            accs.append(phi)
        pj = builder.load(builder.gep(p_ptr, [j]))
        keep = builder.fcmp_unordered("!=", pj, ir.Constant(f32, 0.0))
        splat = builder.insert_element(ir.Constant(vec, ir.Undefined), pj, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(splat, splat, ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))
        row = builder.gep(v_data, [builder.load(builder.gep(off_data, [j]))])
        new_accs = []
        for c in range(n_chunks):
            v = builder.load(builder.bitcast(builder.gep(row, [ir.Constant(i64, LANES * c)]), vptr), align=4)
            term = builder.select(keep, builder.fmul(splat, v), zero)
            new_accs.append(builder.fadd(accs[c], term))
        j_next = builder.add(j, ir.Constant(i64, 1))
        j.add_incoming(j_next, loop)
        for phi, value in zip(accs, new_accs):
            phi.add_incoming(value, loop)
        builder.cbranch(builder.icmp_signed("<", j_next, ir.Constant(i64, BLOCK)), loop, done)
        builder.position_at_end(done)
        for c in range(n_chunks):
            builder.store(new_accs[c], builder.bitcast(builder.gep(out_ptr, [ir.Constant(i64, LANES * c)]), vptr),
                          align=4)
        return context.get_dummy_value()
    return codegen


def _fixed_pv(n_chunks):
    @intrinsic
    def pv(typingctx, out, out_offset, p, p_offset, values, v_off):
        return types.none(out, types.intp, p, types.intp, values, v_off), _pv_codegen(n_chunks)
    return pv


_pv16x1, _pv16x2, _pv16x4, _pv16x8 = (_fixed_pv(n) for n in (1, 2, 4, 8))


@njit(inline="always", cache=True)
def pv_block(out, out_offset, p, p_offset, values, v_off, n):
    """out[out_offset + d] = +0 + sum over j = 0..63 in order of p[p_offset + j] * values[v_off[j] + d],
    d < n, a term with p = 0 skipped (all arrays 1-D, C-contiguous)."""
    if n & 15 == 0:
        chunks = n >> 4
        if chunks == 4:
            _pv16x4(out, out_offset, p, p_offset, values, v_off)
            return
        if chunks == 8:
            _pv16x8(out, out_offset, p, p_offset, values, v_off)
            return
        if chunks == 2:
            _pv16x2(out, out_offset, p, p_offset, values, v_off)
            return
        if chunks == 1:
            _pv16x1(out, out_offset, p, p_offset, values, v_off)
            return
    for d in range(n):
        out[out_offset + d] = F(0.0)
    for j in range(BLOCK):
        pj = p[p_offset + j]
        if pj != F(0.0):
            o = v_off[j]
            for d in range(n):
                out[out_offset + d] = out[out_offset + d] + pj * values[o + d]


def _scores16_codegen(n_chunks):
    """LLVM IR of 16 keys' lanes.dot16 at once: for keys i = 0..15 (k[k_off[j0 + i]:]), the
    16-lane accumulators from +0 as in _dot16_codegen, then the same fixed tree (8, 4, 2, 1)
    done for all 16 keys together with shuffles: each step adds lane l and lane l + width of
    every key, exactly tree_sum16's additions, packing two keys' halves into one vector;
    the 16 sums are stored to out[out_off:+16]."""
    def codegen(context, builder, signature, args):
        q_ty, _, k_ty, off_ty, _, out_ty, _ = signature.args
        q_data = context.make_array(q_ty)(context, builder, args[0]).data
        k_data = context.make_array(k_ty)(context, builder, args[2]).data
        off_data = context.make_array(off_ty)(context, builder, args[3]).data
        out_data = context.make_array(out_ty)(context, builder, args[5]).data
        f32 = ir.FloatType()
        vec = ir.VectorType(f32, LANES)
        vptr = vec.as_pointer()
        i64, i32 = ir.IntType(64), ir.IntType(32)
        q_ptr = builder.gep(q_data, [args[1]])
        qv = [builder.load(builder.bitcast(builder.gep(q_ptr, [ir.Constant(i64, LANES * c)]), vptr), align=4)
              for c in range(n_chunks)]
        lanes = []
        for i in range(LANES):
            offset = builder.load(builder.gep(off_data, [builder.add(args[4], ir.Constant(i64, i))]))
            k_ptr = builder.gep(k_data, [offset])
            acc = ir.Constant(vec, [0.0] * LANES)
            for c in range(n_chunks):
                kv = builder.load(builder.bitcast(builder.gep(k_ptr, [ir.Constant(i64, LANES * c)]), vptr), align=4)
                acc = builder.fadd(acc, builder.fmul(qv[c], kv))
            lanes.append(acc)

        def step(a, b, low):
            high = [x + width for x in low]
            index = ir.VectorType(i32, LANES)
            return builder.fadd(builder.shuffle_vector(a, b, ir.Constant(index, low)),
                                builder.shuffle_vector(a, b, ir.Constant(index, high)))

        v, width = lanes, 8
        while width >= 1:
            # a key's live lanes sit in runs of 2 * width; keep the first half of each run
            # of both operands (a's runs, then b's): lane l + lane l + width
            low = [r * 2 * width + l for r in range(LANES // width) for l in range(width)]
            v = [step(v[2 * m], v[2 * m + 1], low) for m in range(len(v) // 2)]
            width //= 2
        builder.store(v[0], builder.bitcast(builder.gep(out_data, [args[6]]), vptr), align=4)
        return context.get_dummy_value()
    return codegen


def _fixed_scores(n_chunks):
    @intrinsic
    def scores(typingctx, q, q_offset, k, k_off, j0, out, out_offset):
        return (types.none(q, types.intp, k, k_off, types.intp, out, types.intp), _scores16_codegen(n_chunks))
    return scores


_scores16x2, _scores16x4, _scores16x8 = (_fixed_scores(n) for n in (2, 4, 8))


@njit(inline="always", cache=True)
def dot16_at(a, a_offset, b, b_offset, n, lane):
    """lanes.dot16 of a[a_offset:a_offset + n] and b[b_offset:b_offset + n] (1-D float32,
    C-contiguous): lane i adds the products of i, i + 16, ... in order from +0, then the
    fixed tree. lane: (16,) scratch for an n that is not a multiple of 16."""
    if n & 15 == 0:
        chunks = n >> 4
        if chunks == 4:
            return _dot16x4(a, a_offset, b, b_offset)
        if chunks == 8:
            return _dot16x8(a, a_offset, b, b_offset)
        if chunks == 2:
            return _dot16x2(a, a_offset, b, b_offset)
        if chunks == 1:
            return _dot16x1(a, a_offset, b, b_offset)
        return _dot16xn(a, a_offset, b, b_offset, chunks)
    full = n - (n & 15)
    for i in range(LANES):
        lane[i] = F(0.0)
    for k0 in range(0, full, LANES):
        for i in range(LANES):
            lane[i] = lane[i] + a[a_offset + k0 + i] * b[b_offset + k0 + i]
    for k in range(full, n):
        lane[k - full] = lane[k - full] + a[a_offset + k] * b[b_offset + k]
    return _tree16(lane)


@njit(inline="always", cache=True)
def _dequantize_block(bits, group_len, codes, scales, mins, row_base, rows, out, head_dim):
    """Rows of one kv head's int store -> out (64 * hd,) float32: code * scale + min (float32
    multiply, then add: as IntStore.dequantize). codes (n_rows_total * bytes,), scales/mins
    (n_rows_total * groups,) uint16 (f16 bits), flat; row_base: the kv head's first
    row. Eight elements at a time where the group allows (simd.py: the same operations)."""
    n_bytes = head_dim * bits // 8
    groups = head_dim // group_len
    for j in range(BLOCK):
        r = row_base + rows[j]
        c0 = r * n_bytes
        o0 = j * head_dim
        for gi in range(groups):
            scale = half_to_f32(scales[r * groups + gi])
            low = half_to_f32(mins[r * groups + gi])
            if group_len & 7 == 0:
                vscale, vlow = splat_f32(scale), splat_f32(low)
                for d in range(gi * group_len, (gi + 1) * group_len, 8):
                    if bits == 8:
                        v = load_codes8_f32(codes, c0 + d, 8)
                    else:
                        v = load_codes8_f32(codes, c0 + d // 2, 4)
                    store_f32x8(out, (o0 + d) * 4, fadd(fmul(v, vscale), vlow))
            elif bits == 8:
                for d in range(gi * group_len, (gi + 1) * group_len):
                    out[o0 + d] = F(codes[c0 + d]) * scale + low
            else:                                         # 4 bits, the low nibble first
                for i in range(gi * group_len // 2, (gi + 1) * group_len // 2):
                    byte = codes[c0 + i]
                    out[o0 + 2 * i] = F(byte & 15) * scale + low
                    out[o0 + 2 * i + 1] = F(byte >> 4) * scale + low


@njit(inline="always", cache=True)
def _widen_block(halves, row_base, rows, out, head_dim):
    """Rows of one kv head's half store (flat uint16 half bits, rows of hd) -> out (64 * hd,)
    float32, exactly (eight at a time: simd.load_group8)."""
    for j in range(BLOCK):
        h0 = (row_base + rows[j]) * head_dim
        o0 = j * head_dim
        if head_dim & 7 == 0:
            for d in range(0, head_dim, 8):
                store_f32x8(out, (o0 + d) * 4, load_group8(halves, h0 + d))
        else:
            for d in range(head_dim):
                out[o0 + d] = half_to_f32(halves[h0 + d])


@njit(inline="always", cache=True)
def _block_update(qs, q0, group, keys, k_off, values, v_off, vis, s, p, lane, bacc, alpha, cm, cl, cacc, head_dim):
    """One query's chunk state for its G heads (cm, cl (G,), cacc (G, hd)) updated with one
    block: keys[k_off[j]:+hd] and values[v_off[j]:+hd] (flat) its 64 keys and values,
    qs[q0 + g * hd:+hd] the scaled query heads. Scratch: s, p (G, 64), bacc (G, hd), alpha (G,)."""
    chunks = head_dim >> 4
    if head_dim & 15 == 0 and (chunks == 4 or chunks == 8 or chunks == 2):
        flat_s = s.reshape(-1)                             # 16 keys' dot16 at once (the same bits)
        for g in range(group):
            for j0 in range(0, BLOCK, LANES):
                if chunks == 4:
                    _scores16x4(qs, q0 + g * head_dim, keys, k_off, j0, flat_s, g * BLOCK + j0)
                elif chunks == 8:
                    _scores16x8(qs, q0 + g * head_dim, keys, k_off, j0, flat_s, g * BLOCK + j0)
                else:
                    _scores16x2(qs, q0 + g * head_dim, keys, k_off, j0, flat_s, g * BLOCK + j0)
        for j in range(BLOCK):
            if not vis[j]:
                for g in range(group):
                    s[g, j] = NEG_INF
    else:
        for j in range(BLOCK):
            if vis[j]:
                for g in range(group):
                    s[g, j] = dot16_at(qs, q0 + g * head_dim, keys, k_off[j], head_dim, lane)
            else:
                for g in range(group):
                    s[g, j] = NEG_INF
    for g in range(group):
        for i in range(LANES):                             # the block's max (exact: any order gives it)
            lane[i] = s[g, i]
        for j0 in range(LANES, BLOCK, LANES):
            for i in range(LANES):
                x = s[g, j0 + i]
                lane[i] = x if x > lane[i] else lane[i]
        bm = lane[0]
        for i in range(1, LANES):
            bm = lane[i] if lane[i] > bm else bm
        if bm == NEG_INF:                                  # nothing visible: the state stays
            alpha[g] = NEG_INF
            for j in range(BLOCK):
                p[g, j] = F(0.0)
            continue
        m_new = max(cm[g], bm)
        alpha[g] = exp_f32(cm[g] - m_new)
        for j in range(BLOCK):
            p[g, j] = exp_f32(s[g, j] - m_new)             # masked: exp(-inf) = +0
        for i in range(LANES):
            lane[i] = p[g, i]
        for j0 in range(LANES, BLOCK, LANES):
            for i in range(LANES):
                lane[i] = lane[i] + p[g, j0 + i]
        cl[g] = cl[g] * alpha[g] + _tree16(lane)
        cm[g] = m_new
    flat_p = p.reshape(-1)
    flat_acc = bacc.reshape(-1)
    for g in range(group):                                 # a zero term adds nothing to a sum from +0
        if alpha[g] != NEG_INF:
            pv_block(flat_acc, g * head_dim, flat_p, g * BLOCK, values, v_off, head_dim)
    for g in range(group):
        if alpha[g] == NEG_INF:
            continue
        for d in range(head_dim):
            cacc[g, d] = cacc[g, d] * alpha[g] + bacc[g, d]


@njit(cache=True)
def _chunk_tile(t0, t1, h, c, bits, group_len, kf, vf, kc, ks, km, vc, vs, vm, table_row, n_kv, n_rows, qs,
                positions, lowest, ring_blocks, shared_end, tail_rows, cm, cl, cacc):
    """Chunk c of kv head h for queries t0..t1-1 (those whose range holds it) -> their chunk
    states cm, cl (tile, G) and cacc (tile, G, hd), indexed t - t0.

    Stored arrays flat: fp32 (bits 0) kf (.., hd) and vf (.., hd + 1) float32; fp16 (bits 16)
    half bits in ks and vs (.., hd) uint16; int modes codes kc, vc (.., hd * bits / 8) uint8
    and f16 bits ks, km, vs, vm (.., groups) uint16, each over the pool's (n_kv, n_rows) rows.
    The slot's physical row r is pool row table_row[r // 64] * 64 + r % 64 (its block table row)."""
    group, head_dim = cm.shape[1], cacc.shape[2]
    row_base = h * n_rows
    k_stride, v_stride = head_dim, head_dim + 1                  # float modes: values carry a ones column
    kb = np.empty(BLOCK * head_dim, np.float32)
    vb = np.empty(BLOCK * head_dim, np.float32)
    s = np.empty((group, BLOCK), np.float32)
    p = np.empty((group, BLOCK), np.float32)
    bacc = np.empty((group, head_dim), np.float32)
    alpha = np.empty(group, np.float32)
    lane = np.empty(LANES, np.float32)
    rows = np.empty(BLOCK, np.int64)
    k_off = np.empty(BLOCK, np.int64)
    v_off = np.empty(BLOCK, np.int64)
    vis = np.empty(BLOCK, np.bool_)
    if bits != 0:
        for j in range(BLOCK):
            k_off[j] = j * head_dim
            v_off[j] = j * head_dim
    keys = kf if bits == 0 else kb
    values = vf if bits == 0 else vb
    for t in range(t0, t1):
        for g in range(group):
            cm[t - t0, g] = NEG_INF
            cl[t - t0, g] = F(0.0)
            for d in range(head_dim):
                cacc[t - t0, g, d] = F(0.0)
    loaded = -2                                      # whose rows are loaded: -1 the shared ones, t a tail's
    loaded_block = -1
    for b in range(c * CHUNK_BLOCKS, c * CHUNK_BLOCKS + CHUNK_BLOCKS):
        for t in range(t0, t1):
            pos, low = positions[t], lowest[t]
            if b < low // BLOCK or b > pos // BLOCK:
                continue
            for j in range(BLOCK):
                key = b * BLOCK + j
                vis[j] = low <= key and key <= pos
            want = -1 if b < shared_end else t
            if want != loaded or b != loaded_block:
                if want == -1:
                    base = np.int64(table_row[b % ring_blocks if ring_blocks > 0 else b]) * BLOCK
                    for j in range(BLOCK):
                        rows[j] = base + j
                else:
                    offset = (b - shared_end) * BLOCK
                    for j in range(BLOCK):
                        r = tail_rows[t, offset + j]
                        rows[j] = np.int64(table_row[r // BLOCK]) * BLOCK + r % BLOCK
                if bits == 0:
                    for j in range(BLOCK):
                        k_off[j] = (row_base + rows[j]) * k_stride
                        v_off[j] = (row_base + rows[j]) * v_stride
                elif bits == 16:
                    _widen_block(ks, row_base, rows, kb, head_dim)
                    _widen_block(vs, row_base, rows, vb, head_dim)
                else:
                    _dequantize_block(bits, group_len, kc, ks, km, row_base, rows, kb, head_dim)
                    _dequantize_block(bits, group_len, vc, vs, vm, row_base, rows, vb, head_dim)
                loaded, loaded_block = want, b
            _block_update(qs, (t - t0) * group * head_dim, group, keys, k_off, values, v_off, vis, s, p, lane,
                          bacc, alpha, cm[t - t0], cl[t - t0], cacc[t - t0], head_dim)


@njit(inline="always", cache=True)
def _merge(g, mm, ml, macc, cm, cl, cacc, head_dim):
    """Merge head g's chunk state (cm, cl (G,), cacc (G, hd)) into the running (mm, ml, macc)."""
    if cm[g] == NEG_INF:
        return
    m_new = max(mm[g], cm[g])
    a = exp_f32(mm[g] - m_new)
    b = exp_f32(cm[g] - m_new)
    for d in range(head_dim):
        macc[g, d] = macc[g, d] * a + cacc[g, d] * b
    ml[g] = ml[g] * a + cl[g] * b
    mm[g] = m_new


@njit(inline="always", cache=True)
def _query_heads(q, t0, t1, h, group, scale, rotate, norm, qs):
    """The tile's query heads of kv head h, (int4-h: rotated and) scaled -> qs (tile * G * hd,)."""
    head_dim = q.shape[2]
    for t in range(t0, t1):
        for g in range(group):
            row = qs[((t - t0) * group + g) * head_dim:((t - t0) * group + g + 1) * head_dim]
            for d in range(head_dim):
                row[d] = q[t, h * group + g, d]
            if rotate:
                fwht_row(row, head_dim, norm)
            for d in range(head_dim):
                row[d] = row[d] * scale


@njit(inline="always", cache=True)
def _finish(out, t, h, mm, ml, macc, rotate, norm):
    """macc (G, hd) / ml (G,) -> out[t, the heads of kv head h] (int4-h: rotated back)."""
    group, head_dim = macc.shape
    for g in range(group):
        row = out[t, h * group + g]
        for d in range(head_dim):
            row[d] = macc[g, d] / ml[g]
        if rotate:
            fwht_row(row, head_dim, norm)


def _attend_rows_py(q, tile, bits, group_len, kf, vf, kc, ks, km, vc, vs, vm, tables, n_kv, n_rows, positions,
                    lowest, rings, shared_ends, tail_rows, scale, rotate, norm, tile_start, tile_ctx, out):
    """One task per (tile of queries, kv head): each query's chunks computed and merged in order.
    Tile i is queries [tile_start[i], tile_start[i + 1]) (at most `tile`), all of one context
    tile_ctx[i]: a cache slot, whose block table row is tables[ctx], ring rings[ctx] and tree
    boundary shared_ends[ctx] (several caches' queries can share one call, tile by tile)."""
    n_queries, n_heads, head_dim = q.shape
    group = n_heads // n_kv
    n_tiles = tile_ctx.shape[0]
    for task in prange(n_tiles * n_kv):
        i = task // n_kv
        t0, t1 = tile_start[i], tile_start[i + 1]
        ctx = tile_ctx[i]
        h = task % n_kv
        qs = np.empty(tile * group * head_dim, np.float32)
        cm = np.empty((tile, group), np.float32)
        cl = np.empty((tile, group), np.float32)
        cacc = np.empty((tile, group, head_dim), np.float32)
        mm = np.full((tile, group), NEG_INF, np.float32)
        ml = np.zeros((tile, group), np.float32)
        macc = np.zeros((tile, group, head_dim), np.float32)
        _query_heads(q, t0, t1, h, group, scale, rotate, norm, qs)
        c_lo = lowest[t0] // BLOCK // CHUNK_BLOCKS
        c_hi = positions[t0] // BLOCK // CHUNK_BLOCKS
        for t in range(t0, t1):
            c_lo = min(c_lo, lowest[t] // BLOCK // CHUNK_BLOCKS)
            c_hi = max(c_hi, positions[t] // BLOCK // CHUNK_BLOCKS)
        for c in range(c_lo, c_hi + 1):
            _chunk_tile(t0, t1, h, c, bits, group_len, kf, vf, kc, ks, km, vc, vs, vm, tables[ctx], n_kv, n_rows, qs,
                        positions, lowest, rings[ctx], shared_ends[ctx], tail_rows, cm, cl, cacc)
            for t in range(t0, t1):
                if lowest[t] // BLOCK // CHUNK_BLOCKS <= c and c <= positions[t] // BLOCK // CHUNK_BLOCKS:
                    for g in range(group):
                        _merge(g, mm[t - t0], ml[t - t0], macc[t - t0], cm[t - t0], cl[t - t0], cacc[t - t0],
                               head_dim)
        for t in range(t0, t1):
            _finish(out, t, h, mm[t - t0], ml[t - t0], macc[t - t0], rotate, norm)


def _attend_chunks_py(q, tile, bits, group_len, kf, vf, kc, ks, km, vc, vs, vm, tables, n_kv, n_rows, positions,
                      lowest, rings, shared_ends, tail_rows, scale, rotate, norm, tile_start, tile_ctx, task_tile,
                      task_chunk, part_m, part_l, part_acc):
    """One task per (tile, chunk, kv head): the tile's chunk states into the part_* scratch."""
    n_queries, n_heads, head_dim = q.shape
    group = n_heads // n_kv
    for task in prange(task_tile.shape[0] * n_kv):
        k = task // n_kv
        h = task % n_kv
        i = task_tile[k]
        t0, t1 = tile_start[i], tile_start[i + 1]
        ctx = tile_ctx[i]
        qs = np.empty(tile * group * head_dim, np.float32)
        _query_heads(q, t0, t1, h, group, scale, rotate, norm, qs)
        _chunk_tile(t0, t1, h, task_chunk[k], bits, group_len, kf, vf, kc, ks, km, vc, vs, vm, tables[ctx], n_kv,
                    n_rows, qs, positions, lowest, rings[ctx], shared_ends[ctx], tail_rows, part_m[task],
                    part_l[task], part_acc[task])


def _merge_chunks_py(tile_start, tile_of, first_task, tile_chunk0, positions, lowest, part_m, part_l, part_acc, rotate,
                     norm, out):
    """One task per (query, kv head): its own chunks' states merged in chunk order."""
    n_queries, n_heads, head_dim = out.shape
    group = part_m.shape[2]
    n_kv = n_heads // group
    for task in prange(n_queries * n_kv):
        t = task // n_kv
        h = task % n_kv
        i = tile_of[t]
        r = t - tile_start[i]
        mm = np.full(group, NEG_INF, np.float32)
        ml = np.zeros(group, np.float32)
        macc = np.zeros((group, head_dim), np.float32)
        for c in range(lowest[t] // BLOCK // CHUNK_BLOCKS, positions[t] // BLOCK // CHUNK_BLOCKS + 1):
            k = (first_task[i] + c - tile_chunk0[i]) * n_kv + h
            for g in range(group):
                _merge(g, mm, ml, macc, part_m[k, r], part_l[k, r], part_acc[k, r], head_dim)
        _finish(out, t, h, mm, ml, macc, rotate, norm)


# the drivers, threaded and one-thread: the same bodies (prange is range in the latter)
_attend_rows = njit(parallel=True, cache=True)(_attend_rows_py)
_attend_chunks = njit(parallel=True, cache=True)(_attend_chunks_py)
_merge_chunks = njit(parallel=True, cache=True)(_merge_chunks_py)
_attend_rows_serial = njit(cache=True)(_attend_rows_py)
_merge_chunks_serial = njit(cache=True)(_merge_chunks_py)


# ------------------------------------------------------------------------------------ host side
_NO_FLOAT = np.zeros(1, np.float32)
_NO_CODES = np.zeros(1, np.uint8)
_NO_HALF = np.zeros(1, np.uint16)
_NO_TAIL = np.zeros((1, 1), np.int64)


def _flat(array: np.ndarray) -> np.ndarray:
    """A C-contiguous stored array seen as 1-D (a view, never a copy)."""
    if not array.flags.c_contiguous:
        raise ValueError("the KV kernels read C-contiguous stored arrays")
    return array.reshape(-1)


def _operands(bits: int, keys: dict, values: dict):
    """The pool's stored arrays of both sides ((n_kv, rows, ...) each) as the kernels' eight flat
    operands (unused: tiny dummies), and n_kv, n_rows."""
    if bits == 0:
        data = keys["data"]
        return (_flat(data), _flat(values["data"]), _NO_CODES, _NO_HALF, _NO_HALF, _NO_CODES, _NO_HALF,
                _NO_HALF), data.shape[0], data.shape[1]
    if bits == 16:                               # half bits ride in the scale operands
        data = keys["data"]
        return (_NO_FLOAT, _NO_FLOAT, _NO_CODES, _flat(data), _NO_HALF, _NO_CODES, _flat(values["data"]),
                _NO_HALF), data.shape[0], data.shape[1]
    codes = keys["codes"]
    return (_NO_FLOAT, _NO_FLOAT, _flat(codes), _flat(keys["scale"]).view(np.uint16),
            _flat(keys["min"]).view(np.uint16), _flat(values["codes"]), _flat(values["scale"]).view(np.uint16),
            _flat(values["min"]).view(np.uint16)), codes.shape[0], codes.shape[1]


TILE = 16                        # queries that share one load of a block (a speed choice only)
SERIAL_WORK = 48                 # (query, kv head, block) visits below which one thread is faster
SERIAL_MERGE = 16                # (query, kv head) merges below which the merge runs on one thread


@dataclass
class Context:
    """One cache's queries in an attention call: `n_queries` consecutive queries at logical
    `positions`, the window (0: every earlier position), a ring of ring_blocks physical blocks
    (0: none), a draft tree's per-query path rows tail_rows (n_queries, n) from logical block
    shared_end on (None: no tree), and the cache's physical rows per slot (cache_rows)."""
    positions: np.ndarray
    window: int = 0
    ring_blocks: int = 0
    shared_end: int = NO_TREE
    tail_rows: np.ndarray | None = None
    cache_rows: int = 0


class PreparedAttention:
    """What `attend` works out from the positions, the windows, the trees and the store, once:
    the checks, the kernels' common operands, the tiles and the driver. A forward's layers
    share it (backends/cpu/attention.py keeps it on the plan, or on a batched forward's rows);
    `run` takes a layer's q and each context's slot's block table row.

    Several contexts (caches) may share one call: their queries are consecutive in q, each
    tile of queries belongs to one context, and each query's bits are what a call of its own
    context alone gives (a tile only shares block loads among its own queries)."""

    def __init__(self, contexts: list, bits: int, group_len: int, keys: dict, values: dict, scale: float,
                 rotate: bool, head_dim: int, n_heads: int, split: bool | None, tile: int):
        operands, n_kv, n_rows = _operands(bits, keys, values)
        self.n_heads, self.head_dim, self.n_kv = n_heads, head_dim, n_kv
        self.rows_of = [c.cache_rows for c in contexts]
        self.sizes = [len(c.positions) for c in contexts]
        n_queries = self.n_queries = sum(self.sizes)
        self.driver = None
        if n_queries == 0:
            return
        tile = max(1, min(int(tile), max(self.sizes)))
        positions, lowest, tails, tile_start, tile_ctx = [], [], [], [0], []
        width = max([c.tail_rows.shape[1] for c in contexts if c.tail_rows is not None] + [1])
        for index, c in enumerate(contexts):
            pos = np.ascontiguousarray(c.positions, np.int64)
            if not pos.size:
                continue
            low = np.maximum(pos - (c.window - 1), 0) if c.window else np.zeros_like(pos)
            tail = np.zeros((pos.size, width), np.int64)
            if c.tail_rows is not None and c.tail_rows.size:
                tail[:, :c.tail_rows.shape[1]] = c.tail_rows
            # the kernels index without bounds checks: refuse what would read outside the store
            reach = (int(pos.max()) // BLOCK + 1) * BLOCK if not c.ring_blocks else c.ring_blocks * BLOCK
            if reach > c.cache_rows or pos.min() < 0 or tail.min() < 0 or tail.max() >= c.cache_rows:
                raise IndexError(f"attention over rows beyond the cache's {c.cache_rows}")
            positions.append(pos)
            lowest.append(low)
            tails.append(tail)
            for t0 in range(0, pos.size, tile):
                tile_start.append(tile_start[-1] + min(tile, pos.size - t0))
                tile_ctx.append(index)
        positions, lowest, tail = np.concatenate(positions), np.concatenate(lowest), np.concatenate(tails)
        self.tile_start, self.tile_ctx = np.array(tile_start, np.int64), np.array(tile_ctx, np.int64)
        self.tile_of = np.repeat(np.arange(len(tile_ctx), dtype=np.int64), np.diff(self.tile_start))
        rings = np.array([c.ring_blocks for c in contexts], np.int64)
        shared_ends = np.array([c.shared_end if c.tail_rows is not None else NO_TREE for c in contexts], np.int64)
        self.tables = np.zeros((len(contexts), max(r // BLOCK for r in self.rows_of)), np.int32)
        self.pool_blocks = n_rows // BLOCK
        self.tile, self.positions, self.lowest, self.rotate = tile, positions, lowest, bool(rotate)
        self.norm = F(1.0 / np.sqrt(head_dim))
        self.before_tables = (tile, bits, group_len, *operands)
        self.after_tables = (int(n_kv), int(n_rows), positions, lowest, rings, shared_ends, tail, F(scale),
                             bool(rotate), self.norm, self.tile_start, self.tile_ctx)
        if split is None:
            # a speed choice only: split one query's chunks across threads when there are few
            # queries and long contexts; run one thread when the work is tiny
            chunk_span = int((positions // CHUNK_ROWS).max() - (lowest // CHUNK_ROWS).min()) + 1
            split = n_queries * n_kv < 4 * get_num_threads() and chunk_span > 1
            if not split:
                work = int((positions // BLOCK - lowest // BLOCK + 1).sum()) * n_kv
                self.driver = _attend_rows_serial if work < SERIAL_WORK else _attend_rows
                return
        if not split:
            self.driver = _attend_rows
            return
        starts = self.tile_start[:-1]
        chunk_lo = np.minimum.reduceat(lowest // CHUNK_ROWS, starts)
        chunk_hi = np.maximum.reduceat(positions // CHUNK_ROWS, starts)
        n_chunks = chunk_hi - chunk_lo + 1                                               # (tiles,)
        first_task = np.zeros(len(starts) + 1, np.int64)
        np.cumsum(n_chunks, out=first_task[1:])
        self.task_tile = np.repeat(np.arange(len(starts), dtype=np.int64), n_chunks)
        self.task_chunk = np.arange(first_task[-1], dtype=np.int64) - first_task[self.task_tile] + \
            chunk_lo[self.task_tile]
        self.first_task, self.chunk_lo = first_task, np.ascontiguousarray(chunk_lo, np.int64)
        self.n_tasks = int(first_task[-1]) * n_kv

    def run(self, q, table_rows: list) -> np.ndarray:
        """q (T, H, hd) of one layer over each context's slot, whose block table row ((its
        cache_rows / 64,) int32) is table_rows[i] -> (T, H, hd) float32."""
        for i, (row, rows) in enumerate(zip(table_rows, self.rows_of)):
            if row.shape != (rows // BLOCK,) or row.dtype != np.int32:
                raise ValueError(f"a block table row {row.shape} {row.dtype} for {rows} rows")
            self.tables[i, :row.shape[0]] = row
        q = np.ascontiguousarray(q, np.float32)
        if q.shape != (self.n_queries, self.n_heads, self.head_dim):
            raise ValueError(f"queries {q.shape} do not match the prepared "
                             f"{(self.n_queries, self.n_heads, self.head_dim)}")
        out = np.empty(q.shape, np.float32)
        if self.n_queries == 0:
            return out
        if self.driver is not None:
            self.driver(q, *self.before_tables, self.tables, *self.after_tables, out)
            return out
        group = self.n_heads // self.n_kv
        part_m = np.empty((self.n_tasks, self.tile, group), np.float32)
        part_l = np.empty((self.n_tasks, self.tile, group), np.float32)
        part_acc = np.empty((self.n_tasks, self.tile, group, self.head_dim), np.float32)
        _attend_chunks(q, *self.before_tables, self.tables, *self.after_tables, self.task_tile, self.task_chunk,
                       part_m, part_l, part_acc)
        merge = _merge_chunks if self.n_queries * self.n_kv >= SERIAL_MERGE else _merge_chunks_serial
        merge(self.tile_start, self.tile_of, self.first_task, self.chunk_lo, self.positions, self.lowest, part_m,
              part_l, part_acc, self.rotate, self.norm, out)
        return out


def attend(q, bits: int, group_len: int, keys: dict, values: dict, table_row, positions, window: int = 0,
           ring_blocks: int = 0, shared_end: int = NO_TREE, tail_rows=None, scale: float = 1.0,
           rotate: bool = False, split: bool | None = None, tile: int = TILE) -> np.ndarray:
    """Attention of q (T, H, hd) over one slot of the stored sides `keys`, `values` (dicts of a
    pool's (n_kv, rows, ...) arrays: fp32 `data` float32 (bits 0), fp16 `data` uint16 half
    bits (bits 16), int modes `codes` uint8 and `scale`, `min` float16 (bits: the code width);
    group_len the quantization group), the slot's physical block b at pool block table_row[b].

    positions (T,) logical; window 0 = every earlier position; ring_blocks: physical blocks
    of a ring (0: none); logical blocks >= shared_end are read from tail_rows (T, n) physical
    rows of logical positions shared_end * 64 + i; rotate: int4-h (q and the output rotated).
    split, tile: force a driver and a tile size (None: chosen for speed); the bits are the
    same whatever they are. -> (T, H, hd) float32."""
    q = np.ascontiguousarray(q, np.float32)
    table_row = np.ascontiguousarray(table_row, np.int32)
    n_queries, n_heads, head_dim = q.shape
    context = Context(np.asarray(positions), window, ring_blocks, shared_end,
                      None if tail_rows is None else np.asarray(tail_rows), table_row.shape[0] * BLOCK)
    return PreparedAttention([context], bits, group_len, keys, values, scale, rotate, head_dim, n_heads, split,
                             tile).run(q, [table_row])


def attend_many(q, bits: int, group_len: int, keys: dict, values: dict, contexts: list, table_rows: list,
                scale: float = 1.0, rotate: bool = False, split: bool | None = None, tile: int = TILE) -> np.ndarray:
    """attend() for several caches' queries in one call: contexts[i] (a Context) is the i-th
    run of queries of q, over the slot whose block table row is table_rows[i]."""
    q = np.ascontiguousarray(q, np.float32)
    n_queries, n_heads, head_dim = q.shape
    return PreparedAttention(contexts, bits, group_len, keys, values, scale, rotate, head_dim, n_heads, split,
                             tile).run(q, [np.ascontiguousarray(r, np.int32) for r in table_rows])


def warm_up() -> None:
    """Compile (or load from numba's cache) every signature the attention, KV write and
    rotation kernels use, on tiny arrays: call at model load, so no request pays for it."""
    from tinyloop.backends.cpu.kvstore import KVStorage, PoolStorage, kv_write

    rng = np.random.default_rng(0)
    table = np.array([[2, 1]], np.int32)                          # slot 0's two blocks, in pool order 2, 1
    for mode in ("fp32", "fp16", "int4-h"):
        storage = KVStorage(PoolStorage(mode, 1, 192, 16), table)
        kv_write(storage, 0, np.arange(128), rng.standard_normal((128, 1, 16)).astype(F),
                 rng.standard_normal((128, 1, 16)).astype(F))                 # threaded
        kv_write(storage, 0, slice(5, 6), rng.standard_normal((1, 1, 16)).astype(F),
                 rng.standard_normal((1, 1, 16)).astype(F))                     # one thread
        q = rng.standard_normal((2, 2, 16)).astype(F)
        bits = {"fp32": 0, "fp16": 16}.get(mode, 4)
        tail = np.arange(128, dtype=np.int64).reshape(2, 64)
        for split in (False, True):
            attend(q, bits, 16, storage.keys, storage.values, table[0], [100, 127], 0, 0, 1, tail, 0.25,
                   mode == "int4-h", split=split, tile=1)
        many = rng.standard_normal((64, 2, 16)).astype(F)                 # the threaded drivers
        for split in (False, True):
            attend(many, bits, 16, storage.keys, storage.values, table[0], np.arange(64, 128), split=split, tile=4)
