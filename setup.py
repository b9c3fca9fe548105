"""The compiled modules: kcms/sources/_bodyscan.c (a kubelet body read against its template),
kcms/store/_columns.c (two scrapes of a node compared a column at a time),
kcms/apis/metrics/_gzsplice.c (compressed node blocks spliced into a gzipped list) and
kcms/collector/_bodybuffer.c (a kubelet body decrypted straight into the bytes handed on).

Optional: where they cannot be compiled (no C compiler), the install goes on without them and the
same work runs in Python (kcms/sources/decode_template.py, ~2.5x slower a body;
kcms/store/columns.py, 16.4 against 1.6 us a node; a kubelet body copied once more). Everything else is in pyproject.toml."""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]

setup(
    ext_modules=[
        Extension(
            "kcms.sources._bodyscan",
            ["kcms/sources/_bodyscan.c"],
            optional=True,
            extra_compile_args=FLAGS,
        ),
        Extension(
            "kcms.collector._bodybuffer",
            ["kcms/collector/_bodybuffer.c"],
            optional=True,
            extra_compile_args=FLAGS,
        ),
        Extension("kcms.store._columns", ["kcms/store/_columns.c"], optional=True, extra_compile_args=FLAGS),
        Extension(
            "kcms.apis.metrics._gzsplice",
            ["kcms/apis/metrics/_gzsplice.c"],
            optional=True,
            extra_compile_args=FLAGS,
        ),
    ]
)
