"""dlpack_io.tools."""
