"""The one compiled module, kcms/sources/_bodyscan.c (a kubelet body read against its template).

Optional: where it cannot be compiled (no C compiler), the install goes on without it and the same
reading runs in Python (kcms/sources/decode_template.py), ~2.5x slower a body. Everything else is in
pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kcms.sources._bodyscan",
            ["kcms/sources/_bodyscan.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
        )
    ]
)
