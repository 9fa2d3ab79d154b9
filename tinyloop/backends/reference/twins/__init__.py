"""NumPy twins of the CUDA kernels in cuda/*.cu: each function computes what its kernel
computes, in the kernel's own order of float operations, so a test can compare the two
bit for bit (the CPU harness in tests/cudasim runs the .cu sources themselves).

Where a kernel's arithmetic differs from the CPU backend's (a fixed warp reduction
order instead of BLAS's, an online softmax instead of two passes), the twin follows
the kernel; the CPU backend's own functions stay the reference for what the result
means, and tests compare kernel and CPU backend within a tolerance.
"""
