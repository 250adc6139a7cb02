"""The one thing pyproject.toml cannot declare: the optional C module of the kernel backend's data calls.

``pyrds.kernel._fastcall`` (pyrds/kernel/_fastcall.c) lets ``recv``/``sendto``/... of a kernel RDSSocket run
without a Python frame. It is optional: without a C compiler and Python's headers (Debian: gcc, python3-dev)
the build goes on without it and pyrds.kernel uses its pure-Python data calls, which behave the same and cost
one Python call more per data call (docs/benchmarks.md).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pyrds.kernel._fastcall",
            sources=["pyrds/kernel/_fastcall.c"],
            optional=True,
            extra_compile_args=["-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
        )
    ]
)
