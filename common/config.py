"""Engine arguments: what a user sets (CLI flags, `LLM(**kwargs)`), shared by both services."""

import re

import msgspec

from common.limits import FLAG_LIMITS, RequestLimits
from common.pooling_params import RUNNERS, PoolerConfig, parse_pooler_config
from common.speculative import SpeculativeConfig, parse_speculative_config

_LIMITS = RequestLimits()

_SIZE_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "KIB": 1024, "M": 1000**2, "MB": 1000**2,
               "MIB": 1024**2, "G": 1000**3, "GB": 1000**3, "GIB": 1024**3, "T": 1000**4,
               "TB": 1000**4, "TIB": 1024**4}


def parse_size(text: str | int) -> int:
    """'2GiB' -> 2147483648. Raises ValueError with the accepted forms."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _SIZE_UNITS:
        raise ValueError(f"size {text!r} is not a size like 512MiB, 2GiB or 1073741824")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


# A step's token budget, by device and use. Serving on a CPU: a 2048-token step takes seconds, and every
# prompt in it waits for the whole step before its first token; steps of 512 let the first prompts of a
# burst start streaming after a quarter of that. Offline (`LLM`) nobody waits for a first token, and
# steps of 2048 run the W32 batch 6% and a prefill-only batch 8% faster than steps of 512 (fewer steps:
# less per-step and per-layer host work; measured interleaved in one process). vLLM's CPU defaults are
# 2048 (server) and 4096 (offline); 4096 was no faster here than 2048.
DEFAULT_TOKEN_BUDGET = {("cpu", "server"): 512, ("cpu", "offline"): 2048,
                        ("cuda", "server"): 2048, ("cuda", "offline"): 2048}
# the values a flag may take: EngineArgs.validate and the CLI's argparse choices both read these
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")
QUANTIZATIONS = ("auto", "none", "gguf", "int8")
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
USAGES = ("server", "offline")


def _one_of(values) -> str:
    return ", ".join(map(str, values))


class EngineArgs(msgspec.Struct, kw_only=True):
    """Everything that configures an engine: the model, its dtype and device, the KV cache, the scheduler's
    budgets, tensor parallelism, LoRA, speculative decoding and the request limits.

    Each field is the `nvllm serve` flag of the same name (`max_model_len` is `--max-model-len`), with the same
    default and meaning; the [CLI reference](cli.md) lists them. `LLM(model, **fields)` takes them as keyword
    arguments; `validate()` raises a ValueError naming the first bad field and its limit.
    """

    model: str | None = None  # HF folder, GGUF file, or None for the embedded default model
    served_model_name: str | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda
    max_model_len: int | None = None  # None: the model's own limit
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # token budget of one step; None: DEFAULT_TOKEN_BUDGET by device
    block_size: int = 16
    kv_cache_memory: str | int | None = None  # bytes or '2GiB'; default: from device memory
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = 1
    nnodes: int = 1  # hosts the tensor-parallel workers span (the core runs on node 0)
    node_rank: int = 0
    master_addr: str = "127.0.0.1"  # torch.distributed rendezvous, on node 0
    master_port: int = 29511
    seed: int = 0
    attention_backend: str = "auto"  # auto | torch | triton | flash_attn
    # weights kept quantized in memory (engine_core/weights/quantized.py): auto | none | gguf | int8
    quantization: str = "auto"
    # speculative decoding (common/speculative.py); a dict or JSON text is converted on construction
    speculative_config: SpeculativeConfig | None = None
    enforce_eager: bool = False
    # a request's result depends on it alone (batch, budget, prefix cache, preemption): docs/features/determinism.md
    batch_invariant: bool = True
    # LoRA adapters (common/lora.py): requests may name one; max_loras of them resident at once, of rank at most
    # max_lora_rank; max_cpu_loras read adapters kept in memory (None: max_loras)
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # generate: sampled text; pooling: embeddings (prompts only, their pooled final hidden state: pooling_params.py)
    runner: str = "generate"
    pooler_config: PoolerConfig | None = None  # a dict or JSON text is converted on construction; None: LAST, normalized
    cpu_threads: int | None = None  # CPU: torch threads of the core; None: sized to the CPUs other work leaves
    # OpenTelemetry: the OTLP collector both services send spans to (common/tracing.py); None: tracing off
    otlp_traces_endpoint: str | None = None
    usage: str = "server"  # server | offline (set by `LLM`): picks defaults such as the token budget
    # what one request may ask for (common/limits.py); the core sends them to its frontends
    max_n: int = _LIMITS.max_n
    max_logprobs: int = _LIMITS.max_logprobs
    max_stop_strings: int = _LIMITS.max_stop_strings
    max_stop_string_chars: int = _LIMITS.max_stop_string_chars
    max_stop_token_ids: int = _LIMITS.max_stop_token_ids
    max_request_tokens: int = _LIMITS.max_request_tokens
    max_constraint_chars: int = _LIMITS.max_constraint_chars

    def __post_init__(self):
        self.speculative_config = parse_speculative_config(self.speculative_config)
        self.pooler_config = parse_pooler_config(self.pooler_config)

    def token_budget(self, device_type: str) -> int:
        """Tokens one step may compute: the flag, else the default for the device and the use."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return DEFAULT_TOKEN_BUDGET.get((device_type, self.usage), DEFAULT_TOKEN_BUDGET[("cuda", self.usage)])

    def request_limits(self, vocab_size: int, max_model_len: int) -> RequestLimits:
        return RequestLimits(vocab_size=vocab_size, max_model_len=max_model_len,
                             **{name: getattr(self, name) for name in FLAG_LIMITS})

    def _check_types(self) -> None:
        """The constructor takes any value (LLM(batch_invariant="False")): check each field's type here, in the
        caller's process, rather than in the core's as it decodes its config."""
        try:
            msgspec.convert(msgspec.to_builtins(self), type(self))
        except (msgspec.ValidationError, TypeError) as e:
            path = str(e).rsplit(" - at `$.", 1)
            where = path[1].rstrip("`") + ": " if len(path) == 2 else ""
            raise ValueError(f"{where}{path[0]}") from None

    def validate(self) -> None:
        self._check_types()
        checks = [
            (self.dtype in DTYPES, "dtype", f"must be one of {_one_of(DTYPES)}, got {self.dtype!r}"),
            (self.device in DEVICES, "device", f"must be auto, cpu or cuda, got {self.device!r}"),
            (self.max_model_len is None or self.max_model_len >= 1, "max_model_len",
             f"must be at least 1, got {self.max_model_len}"),
            (self.max_num_seqs >= 1, "max_num_seqs", f"must be at least 1, got {self.max_num_seqs}"),
            (self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1, "max_num_batched_tokens",
             f"must be at least 1, got {self.max_num_batched_tokens}"),
            (self.block_size in BLOCK_SIZES, "block_size",
             f"must be a power of two from 1 to 512, got {self.block_size}"),
            (0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization",
             f"must be in (0, 1], got {self.gpu_memory_utilization}"),
            (self.tensor_parallel_size >= 1, "tensor_parallel_size",
             f"must be at least 1, got {self.tensor_parallel_size}"),
            (self.cpu_threads is None or self.cpu_threads >= 1, "cpu_threads",
             f"must be at least 1, got {self.cpu_threads}"),
            (self.max_loras >= 1, "max_loras", f"must be at least 1, got {self.max_loras}"),
            (self.max_lora_rank >= 1, "max_lora_rank", f"must be at least 1, got {self.max_lora_rank}"),
            (self.max_cpu_loras is None or self.max_cpu_loras >= self.max_loras, "max_cpu_loras",
             f"must be at least max_loras ({self.max_loras}), got {self.max_cpu_loras}"),
            (self.quantization in QUANTIZATIONS, "quantization",
             f"must be one of {_one_of(QUANTIZATIONS)}, got {self.quantization!r}"),
            (self.usage in USAGES, "usage", f"must be server or offline, got {self.usage!r}"),
            (self.runner in RUNNERS, "runner", f"must be one of {_one_of(RUNNERS)}, got {self.runner!r}"),
            (self.pooler_config is None or self.runner == "pooling", "pooler_config",
             "is for runner pooling (embeddings); add runner pooling (--runner pooling)"),
            (self.speculative_config is None or self.runner != "pooling", "speculative_config",
             "is for runner generate: a pooling engine generates no tokens"),
            (self.attention_backend in ATTENTION_BACKENDS, "attention_backend",
             f"must be auto, torch, triton or flash_attn, got {self.attention_backend!r}"),
        ] + [(getattr(self, name) >= (0 if name == "max_logprobs" else 1), name,
              f"must be at least {0 if name == 'max_logprobs' else 1}, got {getattr(self, name)}")
             for name in FLAG_LIMITS]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"{name} {why}")
        if self.pooler_config is not None:
            self.pooler_config.validate()
        if self.speculative_config is not None:
            self.speculative_config.validate()
            if self.speculative_config.method == "draft_model" and (self.tensor_parallel_size > 1 or self.nnodes > 1):
                raise ValueError("speculative_config.model: a draft model runs with tensor_parallel_size 1 on one node "
                                 "only; use method ngram with tensor parallelism")
        if self.otlp_traces_endpoint is not None:
            from common.tracing import check_endpoint
            check_endpoint(self.otlp_traces_endpoint)
        if self.kv_cache_memory is not None:
            try:
                size = parse_size(self.kv_cache_memory)
            except ValueError as e:
                raise ValueError(f"kv_cache_memory {e}") from None
            if size <= 0:
                raise ValueError(f"kv_cache_memory must be positive, got {self.kv_cache_memory!r}")
