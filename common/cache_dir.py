"""Where nvllm keeps what it makes once and reuses: imported models, compiled CPU kernels.

$NVLLM_CACHE, else ~/.cache/nvllm.
"""

import os


def cache_dir() -> str:
    return os.path.abspath(os.path.expanduser(os.environ.get("NVLLM_CACHE") or os.path.join("~", ".cache", "nvllm")))
