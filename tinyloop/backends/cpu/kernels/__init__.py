"""The CPU kernels: compiled with numba, row-invariant, the same bits on every CPU.

Why they exist: BLAS picks its summation order from the call (shapes, strides, row count,
thread count) and from the CPU it runs on, so a row's bits could depend on its neighbours
and on the machine. Every kernel here fixes its arithmetic in our own code instead:

- Each output is reduced in an order that depends only on the model's shapes: in order
  along the reduced axis (the linear kernels, linear.py), or in 16 lanes, lane l taking
  its own fixed subset of the axis in order, then the lanes added in a fixed tree
  (lanes.py). Rows, threads and the call's row count never enter it.
- No fast-math: numba leaves LLVM no licence to reassociate or to fuse a multiply and an
  add into an FMA, so a vectorised loop (16 lanes on AVX-512, 2 x 8 on AVX2, 4 x 4 on SSE2)
  performs the very operations, in the very order, of the scalar loop. Vectorisation runs
  across independent lanes or outputs, never across a reduction.
- No libm: exp and tanh are our own (fmath.py), built of IEEE-754 additions,
  multiplications and exact scalings, which every x86-64 and ARM CPU rounds identically
  (glibc's exp picks an FMA or a plain variant by CPU; NumPy's picks AVX-512 or SSE code).
  sqrt and division are IEEE-exact (correctly rounded) everywhere.

Each kernel has a NumPy oracle (`<kernel>_oracle.py`), written from the same definition with
NumPy's elementwise operations (never a reduction NumPy or BLAS may reorder), which the
tests compare bit for bit; `scripts/exactness_matrix.py` re-runs the exactness tests under
NUMBA_CPU_NAME=generic and every named target this CPU can run.
"""
import numba

# LLVM's SLP vectoriser packs the written-out loops of the linear kernels (16 outputs of a
# tile, scripts/gen_linear_kernels.py) into vector registers; numba leaves it off by
# default. It is read when each kernel is compiled, and it never reorders arithmetic
# (without fast-math no vectoriser may), so it changes speed, not bits.
numba.config.SLP_VECTORIZE = 1
