# syntax=docker/dockerfile:1
# KCMS container image: `docker build -t kcms:0.1.0 .`
# The default command runs standalone mode (collector + store + metrics.k8s.io server);
# any other sub-command can be given as arguments, e.g. `docker run kcms:0.1.0 store`.

# Build stage: turn the source tree into a wheel. gcc compiles KCMS's three C modules
# (kcms/sources/_bodyscan.c, the kubelet body reader; kcms/store/_columns.c, the store's column
# comparison; kcms/apis/metrics/_gzsplice.c, the gzipped pod list's splice); all dependencies
# ship wheels.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY kcms/ kcms/
RUN pip wheel --no-deps --wheel-dir /wheels .

# Runtime stage: the package and its dependencies, no source tree, no build leftovers.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
COPY --from=build /wheels /tmp/wheels
RUN pip install /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && groupadd --gid 1000 kcms \
    && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin kcms
# Numeric so that the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 1000:1000
WORKDIR /tmp
# --secure-port used by deploy/base (the Service maps 443 to it).
EXPOSE 10250
ENTRYPOINT ["kcms"]
CMD ["standalone"]
