"""EngineConfig: the settings the engine runs with, resolved once from what the user asked (EngineArgs).

EngineArgs keeps the user's words ("auto", None for "the model's own limit", "2GiB"); the core resolves
them here, once, into concrete values: the model folder and its config.json facts, the dtype and device
chosen for this machine, max_model_len, the token budget, the KV cache bytes. The executor, the model
runner, the draft model and the tensor-parallel workers take this one struct; it goes to the workers
msgpack-encoded through the rendezvous store, so every rank computes with exactly what rank 0 resolved.

Invariants: frozen; msgspec-encodable (plain values only, names for dtype and device); resolving never
changes the EngineArgs it reads.

The KV cache block count is not here: it is known only after every rank has loaded its shard and
measured its memory (on CUDA a profiling step finds what the activations need), so it cannot be part of
what the ranks start from. The executor reports it (num_blocks_for_budget, the minimum over the ranks)
and the core hands it back whole (initialize_cache).
"""

from typing import Any

import msgspec

from common.config import EngineArgs, parse_size
from common.pooling_params import PoolerConfig
from common.speculative import SpeculativeConfig
from engine_core.families.catalog import read_spec
from engine_core.families.spec import ModelSpec


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A model folder, its config.json, and the model's spec as its family reads it (families/)."""
    path: str  # a local folder (a GGUF file is converted to one by the resolver)
    hf_config: dict[str, Any]  # config.json as engine_core/weights/model_folder.read_hf_config normalises it
    spec: ModelSpec  # what the model code builds; a config nvllm cannot honour fails here, naming the field

    @classmethod
    def from_folder(cls, path: str) -> "ModelConfig":
        from engine_core.weights.model_folder import read_hf_config
        hf_config = read_hf_config(path)
        return cls(path=path, hf_config=hf_config, spec=read_spec(hf_config))

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size


class ParallelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Tensor-parallel layout: ranks laid out node by node, rank 0 in the core on node 0."""
    tensor_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"  # the rendezvous store, on node 0
    master_port: int = 29511

    @property
    def is_single_process(self) -> bool:
        return self.tensor_parallel_size == 1 and self.nnodes == 1


class LoRAConfig(msgspec.Struct, frozen=True, kw_only=True):
    """LoRA serving (--enable-lora): adapter slots resident at once, their largest rank, adapters kept read."""
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int = 1


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    model: ModelConfig
    draft_model: ModelConfig | None = None  # speculative decoding with a draft model
    dtype: str  # float32 | bfloat16 | float16, never auto
    device: str  # cpu | cuda (the device type; each rank picks its own index)
    max_model_len: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int  # the step's token budget, defaults applied
    enable_prefix_caching: bool
    parallel: ParallelConfig
    seed: int
    attention_backend: str
    quantization: str
    enforce_eager: bool
    batch_invariant: bool
    kv_cache_memory: int | None  # bytes; None: from device memory (gpu_memory_utilization) or the CPU default
    gpu_memory_utilization: float
    speculative_config: SpeculativeConfig | None
    cpu_threads: int | None
    lora: LoRAConfig | None = None  # None: --enable-lora is off
    runner: str = "generate"  # generate | pooling (embeddings: prompts only, engine_core/pooling/)
    pooler: PoolerConfig | None = None  # with runner pooling: how the prompt's hidden states become one vector

    def torch_dtype(self):
        from engine_core.platform.device import torch_dtype
        return torch_dtype(self.dtype)

    def for_draft_model(self) -> "EngineConfig":
        """The draft model's config: its own folder and facts, everything else the target's (no LoRA: adapters
        are the target's; the draft proposes from the base model, and verification keeps only what the adapter
        would have sampled)."""
        return msgspec.structs.replace(self, model=self.draft_model, draft_model=None, speculative_config=None,
                                       lora=None, runner="generate", pooler=None)

    def with_model_path(self, path: str) -> "EngineConfig":
        """The same config reading weights from another copy of the model (a worker node's own folder)."""
        return msgspec.structs.replace(self, model=msgspec.structs.replace(self.model, path=path))


def resolve_engine_config(args: EngineArgs) -> EngineConfig:
    """Validates `args` and resolves them for this machine. Loads no weights."""
    from engine_core.platform.device import pick_device, pick_dtype
    from engine_core.weights.model_resolver import resolve_model

    args.validate()
    model = ModelConfig.from_folder(resolve_model(args.model))
    spec = args.speculative_config
    draft = None
    if spec is not None and spec.method == "draft_model":
        draft = ModelConfig.from_folder(resolve_model(spec.model))
        if draft.vocab_size != model.vocab_size:
            raise ValueError(f"speculative_config.model has a vocabulary of {draft.vocab_size} tokens, the "
                             f"target {model.vocab_size}: a draft model must share the target's tokenizer")
    device = pick_device(args.device)
    return EngineConfig(
        model=model,
        draft_model=draft,
        dtype=str(pick_dtype(args.dtype, device)).removeprefix("torch."),
        device=device.type,
        max_model_len=_max_model_len(args.max_model_len, model.spec.max_position),
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.token_budget(device.type),
        enable_prefix_caching=args.enable_prefix_caching,
        parallel=ParallelConfig(tensor_parallel_size=args.tensor_parallel_size, nnodes=args.nnodes,
                                node_rank=args.node_rank, master_addr=args.master_addr,
                                master_port=args.master_port),
        seed=args.seed,
        attention_backend=args.attention_backend,
        quantization=args.quantization,
        enforce_eager=args.enforce_eager,
        batch_invariant=args.batch_invariant,
        kv_cache_memory=None if args.kv_cache_memory is None else parse_size(args.kv_cache_memory),
        gpu_memory_utilization=args.gpu_memory_utilization,
        speculative_config=None if spec is None else msgspec.structs.replace(spec),  # not shared with args
        cpu_threads=args.cpu_threads,
        lora=LoRAConfig(max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
                        max_cpu_loras=args.max_cpu_loras or args.max_loras) if args.enable_lora else None,
        runner=args.runner,
        pooler=(msgspec.structs.replace(args.pooler_config or PoolerConfig()) if args.runner == "pooling" else None),
    )


def _max_model_len(asked: int | None, limit: int) -> int:
    if asked is None:
        return limit
    if asked > limit:
        raise ValueError(f"max_model_len {asked} exceeds the model's max_position_embeddings {limit}")
    return asked
