"""cuda/kv.cu through its launchers on the kernel_device fixture (the CPU harness running the
.cu file in several thread orders, or a GPU): stores equal the CPU backend's bit for bit
(fp16, fp32, int8, int4) or the twin's (int4-h, whose rotation the CPU backend computes
with BLAS); the accepted-path row copy has NumPy's fancy-index semantics."""
import types

import numpy as np
import pytest

from tinyloop.backends.reference import NumpyBackend
from tinyloop.backends.reference.twins import kv as twin
from tinyloop.backends.cuda.launch import kv as launch
from tinyloop.kv.modes import group_size, hadamard
from tinyloop.model.plan import Geometry
from tinyloop.model.quant import unpack_codes

F = np.float32

def shuffled_table(n_slots, rows, seed=0):
    """A block table over a pool of n_slots * blocks + 4 blocks, in shuffled order (block 0, the
    null block, never handed out): the kernels must follow it wherever it puts a block."""
    blocks = rows // 64
    ids = np.random.default_rng(seed).permutation(n_slots * blocks + 3)[:n_slots * blocks] + 1
    return ids.astype(np.int32).reshape(n_slots, blocks)


def device_kv(device, mode, n_slots, n_kv, rows, head_dim, seed=0):
    """One cache's storage on the device: a pool with spare blocks, seen through a shuffled table."""
    table = shuffled_table(n_slots, rows, seed)
    pool = launch.DeviceKV.allocate(mode, n_kv, 64 * (table.size + 4), head_dim, types.SimpleNamespace(zeros=device.zeros))

    def upload(buffer, values):
        buffer[...] = device.asarray(np.asarray(values, np.int32))
    return launch.DeviceView(pool, table, device.zeros(table.shape, np.int32), upload)


def cpu_storage(mode, n_kv, rows, head_dim, table):
    """The NumPy reference backend's storage over the same table (so the same pool rows)."""
    cpu = NumpyBackend()
    return cpu, cpu.kv_view(cpu.kv_pool(mode, n_kv, 64 * (table.size + 4), head_dim), table)


def host_sides(device, kv) -> tuple:
    """The device pool's arrays on the host: (keys dict, values dict)."""
    return tuple({name: device.to_host(a) for name, a in side.items()} for side in (kv.keys, kv.values))


def fused_keys_values(rng, n_tokens, n_kv, head_dim):
    """Keys and values as column views of one fused (T, q | k | v | pad) array, as the
    backend hands them over: (host fused, key columns, value columns). Token 0's first key
    head holds quantization edge cases in each group: min 0 and max 15 (scale exactly 1
    for int4) with every other value on a half-integer (rint's ties go to even) or past
    15 (clipped for int4); its first value head is constant (scale 0)."""
    width = n_kv * head_dim
    fused = rng.standard_normal((n_tokens, 3 * width + 5)).astype(F)
    fused *= rng.uniform(0.05, 20, (n_tokens, 1)).astype(F)               # rows of very different ranges
    g = group_size(head_dim)
    ties = np.concatenate([[0.0, 15.0], np.arange(g - 2) + 0.5])
    fused[0, width:width + head_dim] = np.tile(ties, head_dim // g)
    fused[0, 2 * width:2 * width + head_dim] = 3.0
    return fused, slice(width, 2 * width), slice(2 * width, 3 * width)


def write(device, kv, slot, rows, fused, k_cols, v_cols):
    """kv_write through the launcher from column views of the fused array on the device."""
    n_tokens = fused.shape[0]
    on_device = device.asarray(fused)
    keys = on_device[:, k_cols].reshape(n_tokens, kv.n_kv, kv.head_dim)
    values = on_device[:, v_cols].reshape(n_tokens, kv.n_kv, kv.head_dim)
    launch.kv_write(device.module("kv"), kv, slot, device.asarray(np.asarray(rows, np.int32)), keys, values)


CASES = [  # (n_kv, head_dim, n_tokens, ring): head_dim 48 has one group of 48
    (2, 64, 5, False), (1, 128, 65, True), (3, 16, 1, False), (2, 48, 17, True)]


@pytest.mark.parametrize("mode", ["fp16", "fp32", "int8", "int4"])
@pytest.mark.parametrize("n_kv, head_dim, n_tokens, ring", CASES)
def test_kv_write_equals_cpu_store(kernel_device, mode, n_kv, head_dim, n_tokens, ring):
    rng = np.random.default_rng(n_kv * head_dim + n_tokens)
    n_slots, rows = 3, 128
    geometry = Geometry(rows, rows if ring else None, 0)
    first = 100 if ring else 20                            # a ring: rows wrap past 127 to 0
    write_rows = geometry.physical(np.arange(first, first + n_tokens))
    fused, k_cols, v_cols = fused_keys_values(rng, n_tokens, n_kv, head_dim)
    kv = device_kv(kernel_device, mode, n_slots, n_kv, rows, head_dim)
    write(kernel_device, kv, 1, write_rows, fused, k_cols, v_cols)

    cpu, storage = cpu_storage(mode, n_kv, rows, head_dim, kv.table)
    shape = (n_tokens, n_kv, head_dim)
    cpu.kv_write(storage, 1, types.SimpleNamespace(write_rows=write_rows),
                 fused[:, k_cols].reshape(shape), fused[:, v_cols].reshape(shape))
    expected = {f"{side}.{name}": array for side, arrays in (("keys", storage.keys), ("values", storage.values))
                for name, array in arrays.items()}
    for side, arrays in zip(("keys", "values"), host_sides(kernel_device, kv)):
        for name, got in arrays.items():
            want = expected[f"{side}.{name}"][..., :got.shape[-1]]      # the CPU's values carry a ones column
            if mode == "fp16":
                want = want.astype(np.float16)                          # float32 holding half values, exactly
            assert got.dtype == want.dtype and got.shape == want.shape, (side, name)
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (side, name)   # every other block untouched


@pytest.mark.parametrize("n_kv, head_dim, n_tokens, ring", [(2, 64, 5, False), (1, 128, 65, True), (3, 16, 1, False)])
def test_kv_write_int4h_equals_twin_and_approximates_cpu(kernel_device, n_kv, head_dim, n_tokens, ring):
    """Bitwise against the twin (FWHT then * norm). The CPU backend rotates with a BLAS
    product whose sums round differently (where the FWHT gives an exact 0, BLAS may leave
    1e-7 of noise), so against it, with `noise` = 2e-6 of the row's largest rotated value:
    the rotations agree within rounding; scales and mins within one f16 ulp + noise; the
    codes of groups whose step is above the noise differ in under 2% of places (a value on
    a rounding boundary); dequantized values within a step + noise."""
    rng = np.random.default_rng(head_dim + n_tokens)
    rows = 128
    write_rows = Geometry(rows, rows if ring else None, 0).physical(np.arange(90, 90 + n_tokens))
    fused, k_cols, v_cols = fused_keys_values(rng, n_tokens, n_kv, head_dim)
    kv = device_kv(kernel_device, "int4-h", 2, n_kv, rows, head_dim)
    write(kernel_device, kv, 0, write_rows, fused, k_cols, v_cols)
    shape = (n_tokens, n_kv, head_dim)
    keys, values = fused[:, k_cols].reshape(shape), fused[:, v_cols].reshape(shape)

    twin_sides = launch.DeviceKV.allocate("int4-h", n_kv, kv.pool.rows, head_dim)
    twin.kv_write("int4-h", twin_sides.keys, twin_sides.values, kv.table[0], write_rows, keys, values)
    got = host_sides(kernel_device, kv)
    for side, want in zip(got, (twin_sides.keys, twin_sides.values)):
        for name in side:
            assert np.array_equal(side[name].view(np.uint8), want[name].view(np.uint8)), name

    cpu, storage = cpu_storage("int4-h", n_kv, rows, head_dim, kv.table)
    cpu.kv_write(storage, 0, types.SimpleNamespace(write_rows=write_rows), keys, values)
    pool_rows = storage.pool_rows(0, write_rows)
    g = group_size(head_dim)
    for x, store, arrays, side in ((keys, storage.key_store, storage.keys, got[0]),
                                   (values, storage.value_store, storage.values, got[1])):
        rotated = twin.fwht(x).transpose(1, 0, 2)                                   # (n_kv, T, hd)
        assert np.allclose(rotated, (x @ hadamard(head_dim)).transpose(1, 0, 2), rtol=1e-5, atol=1e-5)
        noise = 2e-6 * np.abs(rotated).max(axis=-1, keepdims=True)                  # (n_kv, T, 1)
        for name in ("scale", "min"):
            a, b = side[name][:, pool_rows].astype(F), arrays[name][:, pool_rows].astype(F)
            assert np.all(np.abs(a - b) <= np.abs(b) * 2.0 ** -10 + noise), name
        step_kernel, step_cpu = (np.repeat(a["scale"][:, pool_rows].astype(F), g, axis=-1) for a in (side, arrays))
        codes_kernel, codes_cpu = (unpack_codes(a["codes"][:, pool_rows].reshape(-1, head_dim // 2), 4)
                                   .reshape(step_cpu.shape) for a in (side, arrays))
        above_noise = np.minimum(step_kernel, step_cpu) > noise
        assert np.mean(codes_kernel[above_noise] != codes_cpu[above_noise]) < 0.02
        mine = store.rows(side, pool_rows)[..., :head_dim]                         # IntStore reads the kernel's arrays
        theirs = store.rows(arrays, pool_rows)[..., :head_dim]
        assert np.all(np.abs(mine - theirs) <= np.maximum(step_kernel, step_cpu) * 1.01 + noise)


def test_fwht_norm_is_float32_of_inverse_sqrt():
    """The kernels build float32(1/sqrt(hd)) from a power of two and float32(1/sqrt(2));
    the twin and kv/modes.py round 1/sqrt(hd) directly: the same float for every hd."""
    for k in range(11):
        head_dim = 1 << k
        built = np.float32(0.70710678118654752 if k & 1 else 1.0) * np.float32(2.0 ** -(k >> 1))
        assert built == twin.hadamard_norm(head_dim) == hadamard(head_dim)[0, 0], head_dim


@pytest.mark.parametrize("source, target", [
    ([10, 11, 12, 13], [9, 10, 11, 12]),          # shifted down: every target but one is a source
    ([3, 4, 5], [4, 5, 6]),                       # shifted up
    ([3, 7, 70], [7, 3, 0]),                      # a swap, and a row from another block
    ([5], [5])])
def test_rows_gather_scatter_has_numpy_semantics(kernel_device, source, target):
    rng = np.random.default_rng(len(source))
    host = [rng.integers(0, 256, (3, 128, 33), np.uint8),                  # odd row bytes: the byte path
            rng.standard_normal((3, 128, 2)).astype(np.float16),           # 4-byte rows: the word path
            rng.standard_normal((3, 128, 48)).astype(F)]                   # (n_kv, pool rows, ...)
    arrays = [kernel_device.asarray(a) for a in host]
    n = len(source)
    scratch = kernel_device.zeros((max(3 * n * a[0, 0].nbytes for a in host),), np.uint8)
    launch.copy_rows(kernel_device.module("kv"), arrays, kernel_device.asarray(np.array(source, np.int32)),
                     kernel_device.asarray(np.array(target, np.int32)), scratch)
    twin.copy_rows(host, source, target)
    for got, want in zip(arrays, host):
        assert np.array_equal(kernel_device.to_host(got).view(np.uint8), want.view(np.uint8))


def test_device_kv_layout_and_bytes(kernel_device):
    kv = device_kv(kernel_device, "int4", 2, 4, 64, 48)
    pool_rows = 64 * (2 + 4)
    assert kv.keys["codes"].shape == (4, pool_rows, 24) and kv.keys["scale"].shape == (4, pool_rows, 1)
    assert (kv.n_slots, kv.rows, kv.pool.rows) == (2, 64, pool_rows)
    assert kv.pool.bytes_per_row == 2 * 4 * (24 + 4)
    assert kv.pool.scratch_bytes(3) == 4 * 3 * 24
    assert device_kv(kernel_device, "fp16", 1, 2, 64, 16).pool.bytes_per_row == 2 * 2 * 16 * 2
    with pytest.raises(ValueError, match="power-of-two"):
        device_kv(kernel_device, "int4-h", 1, 1, 64, 48)
    with pytest.raises(ValueError, match="slot 2 outside"):
        kv.blocks(2)


def test_the_table_on_the_device_follows_the_host_table(kernel_device):
    """A cache that takes a block updates its host table; sync() puts it on the device, where a
    kernel (and a captured graph) reads it: a write after the change lands in the new block."""
    kv = device_kv(kernel_device, "fp32", 1, 1, 128, 16)
    kv.table[0, 1] = min(set(range(1, kv.pool.rows // 64)) - set(kv.table.ravel().tolist()))    # a spare block
    kv.sync()
    assert np.array_equal(kernel_device.to_host(kv.device_table), kv.table)
    x = np.arange(16, dtype=F).reshape(1, 1, 16)
    launch.kv_write(kernel_device.module("kv"), kv, 0, kernel_device.asarray(np.array([70], np.int32)),
                    kernel_device.asarray(x), kernel_device.asarray(-x))
    keys = kernel_device.to_host(kv.keys["data"])
    assert np.array_equal(keys[0, kv.table[0, 1] * 64 + 6], x[0, 0])


def rotations(rng, n_tokens, head_dim):
    """RoPE rows as the model's table holds them: (T, hd/2) complex64 on the unit circle."""
    angles = rng.uniform(-np.pi, np.pi, (n_tokens, head_dim // 2))
    return (np.cos(angles) + 1j * np.sin(angles)).astype(np.complex64)


@pytest.mark.parametrize("mode", ["fp16", "int4", "int4-h"])
def test_a_fused_rope_gives_the_bits_of_rope_rows_then_the_write(kernel_device, mode):
    """kv_write with the forward's rotation: the stored keys and values, and the keys left in
    the fused array, are those of rope_rows' twin applied first and a plain write (the model's
    order without the fusion); values and queries' columns untouched."""
    from tinyloop.backends.reference.twins.elementwise import rope_rows
    rng = np.random.default_rng(41)
    n_kv, head_dim, n_tokens = 2, 64, 9
    fused, k_cols, v_cols = fused_keys_values(rng, n_tokens, n_kv, head_dim)
    rotation = rotations(rng, n_tokens, head_dim)
    rows = rng.permutation(128)[:n_tokens]
    rotated = fused.copy()
    rotated[:, k_cols] = rope_rows(fused[:, k_cols].reshape(n_tokens, n_kv, head_dim), rotation).reshape(n_tokens, -1)
    plain = device_kv(kernel_device, mode, 2, n_kv, 128, head_dim)
    write(kernel_device, plain, 1, rows, rotated, k_cols, v_cols)

    fusing = device_kv(kernel_device, mode, 2, n_kv, 128, head_dim)
    on_device = kernel_device.asarray(fused)
    keys = on_device[:, k_cols].reshape(n_tokens, n_kv, head_dim)
    values = on_device[:, v_cols].reshape(n_tokens, n_kv, head_dim)
    launch.kv_write(kernel_device.module("kv"), fusing, 1, kernel_device.asarray(np.asarray(rows, np.int32)),
                    keys, values, kernel_device.asarray(rotation))
    for got, want in zip(host_sides(kernel_device, fusing), host_sides(kernel_device, plain)):
        for name in want:
            assert np.array_equal(got[name].view(np.uint8), want[name].view(np.uint8)), name
    assert np.array_equal(kernel_device.to_host(on_device).view(np.uint32), rotated.view(np.uint32))


def test_a_rotation_of_the_wrong_shape_is_refused(kernel_device):
    kv = device_kv(kernel_device, "fp16", 1, 2, 64, 16)
    keys = kernel_device.zeros((3, 2, 16), F)
    with pytest.raises(ValueError, match="rotation must be contiguous"):
        launch.kv_write(kernel_device.module("kv"), kv, 0, kernel_device.asarray(np.arange(3, dtype=np.int32)),
                        keys, keys, kernel_device.asarray(np.zeros((3, 16), np.complex64)))
