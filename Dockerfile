# syntax=docker/dockerfile:1
# elastic-sidecar: the coordinator / worker daemon as a small, non-root image.
#
#   docker build -t elastic-sidecar:0.1.0 .
#   docker run --rm elastic-sidecar:0.1.0            # prints --help
#
# Stage 1 builds this project's wheel and installs it, with the `pubsub` extra
# and the exact versions in constraints.txt, into a virtual environment.
# Stage 2 is the same Python base with only that environment, running as
# uid/gid 65532 (the deploy manifests' runAsUser).

FROM python:3.12.7-slim-bookworm AS build

# PIP_CONSTRAINT pins the build backend (setuptools) in pip's isolated build
# environment too.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_CONSTRAINT=/src/constraints.txt

WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY agent/ agent/
COPY trainer_hooks/ trainer_hooks/
COPY protos/ protos/

# The wheel holds agent, trainer_hooks and protos (pyproject.toml); runtime
# dependencies only: the core ones plus the `pubsub`, `tpu` and `drill` extras (not demo/test):
# `drill` is the official kubernetes client, which the coordinator's --straggler-replace uses.
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install -c constraints.txt "$(echo /wheels/elastic_sidecar-*.whl)[pubsub,tpu,drill]" \
 && /opt/venv/bin/elastic-sidecar --help > /dev/null


FROM python:3.12.7-slim-bookworm

LABEL org.opencontainers.image.title="elastic-sidecar" \
      org.opencontainers.image.description="Recovery sidecar for multi-slice MaxText training" \
      org.opencontainers.image.licenses="Apache-2.0"

RUN groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin nonroot

COPY --from=build /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# 29310 peers, 29311 admin (loopback by default), 29312 HTTP, 29313 trainer link
# (loopback by default; with a token when not). The image also runs
# `elastic-sidecar inject - < jobset.yaml` (deploy/README.md).
EXPOSE 29310 29312 29313

USER 65532:65532

ENTRYPOINT ["elastic-sidecar"]
CMD ["--help"]
