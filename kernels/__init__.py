"""dlpack_io.kernels."""
