"""Build the optional C extension dlpack_io.reader._jpeg (everything else is in pyproject.toml).

The extension decodes only the region of a JPEG that a crop needs, at a reduced DCT scale,
against the system libjpeg(-turbo) (Debian: libjpeg62-turbo-dev). It is optional: when the
headers or a compiler are missing the build skips it and the reader falls back to PIL.
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension("dlpack_io.reader._jpeg", sources=["reader/_jpeg.c", "reader/_restarts.c",
                                                    "reader/_resize.c", "reader/_planes.c",
                                                    "reader/_huffman.c"],
              depends=["reader/_planes.h", "reader/_huffman.h"], libraries=["jpeg"],
              extra_compile_args=["-O3", "-std=c99"], optional=True),
])
