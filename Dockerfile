# syntax=docker/dockerfile:1
# kallot's image: one image for the live scheduler (`kallot scheduler`) and the node agent
# (`kallot agent run`); the chart picks the command with `args`. Built by `make image`
# (docs/install.md, "The image"). Two stages: the first builds a virtual environment holding
# exactly requirements.lock (the full closure of pyproject.toml's pins, `make lock`) plus kallot
# itself; the second copies only that environment onto a clean slim Python, so no compiler,
# build backend or pip cache is in the image. tests/test_image.py runs the build stage's install
# steps in a clean venv and lints this file with hadolint.
ARG PYTHON_VERSION=3.11
# The base of both stages. Without a registry, tools/image/base.sh makes one locally under this
# name (`make image-base`; docs/install.md, "Building the image without a registry").
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# No pip, setuptools or wheel inside the environment: the base image's pip installs into it, so
# the environment holds the lock and kallot, nothing else.
RUN python -m venv --without-pip /opt/kallot
COPY requirements.lock ./
RUN pip --python /opt/kallot/bin/python install --no-deps --only-binary=:all: -r requirements.lock
COPY pyproject.toml README.md ./
COPY src ./src
# The dependencies' own test suites (numpy, matplotlib, ...: about 25 MB) are never imported.
RUN pip --python /opt/kallot/bin/python install --no-deps . \
    && pip --python /opt/kallot/bin/python check \
    && find /opt/kallot/lib -type d -name tests -prune -exec rm -rf {} +

FROM ${BASE_IMAGE}
# The scheduler runs as this user (the chart's runAsUser 65532); the agent's DaemonSet overrides
# it with uid 0, only to create sockets in the kubelet's root-owned device-plugin directory.
RUN groupadd --system --gid 65532 kallot \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin kallot
COPY --from=build /opt/kallot /opt/kallot
# `/` is not writable by uid 65532 and the user has no home: commands that write (the
# simulator's reports, matplotlib's font cache) get /tmp, so they work with nothing mounted.
ENV PATH=/opt/kallot/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /tmp
# Labels last: REVISION and CREATED change with every build, and a step after them would never
# come from the layer cache.
ARG PYTHON_VERSION
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kallot" \
      org.opencontainers.image.description="kallot, a GPU scheduler for Kubernetes: the live scheduler and the node agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.url="https://kallot.io" \
      org.opencontainers.image.source="https://github.com/kallot/kallot" \
      org.opencontainers.image.documentation="https://github.com/kallot/kallot/blob/main/docs/install.md" \
      org.opencontainers.image.vendor="kallot" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:${PYTHON_VERSION}-slim-bookworm"
USER 65532:65532
ENTRYPOINT ["kallot"]
CMD ["--help"]
