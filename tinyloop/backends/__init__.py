"""Backends: the objects that own the kernels (NumPy on the CPU; CuPy + CUDA on a GPU)."""
