"""Engine flags (vLLM's names) shared by every subcommand that starts an engine core."""

import argparse

from common.config import ATTENTION_BACKENDS, BLOCK_SIZES, DEVICES, DTYPES, QUANTIZATIONS, EngineArgs, parse_size
from common.cli.arg_types import non_negative_int, positive_int
from common.pooling_params import RUNNERS, parse_pooler_config
from common.speculative import parse_speculative_config


def _size(text: str) -> str:
    parse_size(text)  # raises ValueError -> argparse prints a one-line error
    return text


def _speculative_config(text: str):
    try:
        config = parse_speculative_config(text)
        config.validate()
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return config


def _pooler_config(text: str):
    try:
        return parse_pooler_config(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def add_engine_args(parser: argparse.ArgumentParser, with_model: bool = True) -> None:
    d = EngineArgs()
    if with_model:
        parser.add_argument("model", nargs="?", default=None,
                            help="HF model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    g = parser.add_argument_group("engine")
    g.add_argument("--served-model-name", default=None, help="model name the API reports (default: the model)")
    g.add_argument("--dtype", default=d.dtype, choices=DTYPES,
                   help="weights and activations; auto is bfloat16 on CUDA and on the amx / avx512_bf16 CPU "
                        "tiers, else float32")
    g.add_argument("--device", default=d.device, choices=DEVICES, help="where the model runs")
    g.add_argument("--max-model-len", type=positive_int, default=None,
                   help="longest prompt + output in tokens (default: the model's own limit)")
    g.add_argument("--max-num-seqs", type=positive_int, default=d.max_num_seqs,
                   help="most requests running at once")
    g.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="token budget of one engine step (decodes + prefill chunks); default: 512 on CPU "
                        "(a burst of prompts starts streaming sooner), 2048 on CUDA")
    g.add_argument("--block-size", type=int, default=d.block_size, choices=BLOCK_SIZES,
                   help="tokens per KV cache block (flash-attn's paged kernels need 256 or 512)")
    g.add_argument("--kv-cache-memory", type=_size, default=None,
                   help="KV cache size, e.g. 2GiB (default: 1GiB on CPU; on CUDA from --gpu-memory-utilization)")
    g.add_argument("--gpu-memory-utilization", type=_fraction, default=d.gpu_memory_utilization,
                   help="fraction of GPU memory the engine may use (CUDA)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=d.enable_prefix_caching,
                   help="reuse KV blocks of shared prompt prefixes")
    g.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=d.tensor_parallel_size,
                   help="worker processes (devices) the model is split over")
    g.add_argument("--nnodes", type=positive_int, default=d.nnodes, help="hosts the tensor-parallel workers span")
    g.add_argument("--node-rank", type=int, default=d.node_rank, help="this host's rank among --nnodes (0 runs the core)")
    g.add_argument("--master-addr", default=d.master_addr, help="address of node 0 for torch.distributed rendezvous")
    g.add_argument("--master-port", type=int, default=d.master_port, help="port of node 0 for the rendezvous")
    g.add_argument("--seed", type=int, default=d.seed, help="seed for requests that give none")
    g.add_argument("--attention-backend", default=d.attention_backend, choices=ATTENTION_BACKENDS,
                   help="attention kernels; auto: flash_attn, else triton on CUDA; torch on CPU")
    g.add_argument("--quantization", "-q", default=d.quantization, choices=QUANTIZATIONS,
                   help="weights kept quantized in memory (CPU, float32 or bf16, every tier, each rank its shard): gguf keeps a GGUF's Q4_0/Q4_1/Q8_0 "
                        "tensors, int8 quantizes the linear layers per channel, none dequantizes; auto: gguf where "
                        "the model has such tensors and the kernels run, else none")
    g.add_argument("--speculative-config", type=_speculative_config, default=None,
                   help='speculative decoding, as JSON: \'{"method": "ngram", "num_speculative_tokens": 4, '
                        '"prompt_lookup_max": 4}\' (prompt lookup) or \'{"model": PATH, "num_speculative_tokens": 4}\' '
                        '(a draft model with the same vocabulary); greedy output is unchanged, sampled output keeps '
                        'its distribution')
    g.add_argument("--runner", default=d.runner, choices=RUNNERS,
                   help="generate: text (completions, chat); pooling: embeddings (/v1/embeddings, LLM.embed): "
                        "prompts only, their pooled final hidden state")
    g.add_argument("--pooler-config", type=_pooler_config, default=None,
                   help='with --runner pooling, as JSON: \'{"pooling_type": "LAST", "normalize": true}\' '
                        '(pooling_type LAST, MEAN or CLS; normalize: L2). Default LAST, normalized')
    g.add_argument("--cpu-threads", type=positive_int, default=None,
                   help="CPU: threads the model runs on (default: as many as the CPUs other processes leave free, "
                        "checked every second)")
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    g.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=d.batch_invariant,
                   help="kernels whose result for a request does not depend on the rest of the batch, the token "
                        "budget, prefix-cache hits or preemption (docs: features/determinism); --no-batch-invariant "
                        "takes the shape-tuned kernels")
    lo = parser.add_argument_group("LoRA adapters")
    lo.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (PEFT folders) over the model")
    lo.add_argument("--max-loras", type=positive_int, default=d.max_loras,
                    help="adapters resident at once (one step uses at most this many)")
    lo.add_argument("--max-lora-rank", type=positive_int, default=d.max_lora_rank,
                    help="largest adapter rank accepted")
    lo.add_argument("--max-cpu-loras", type=positive_int, default=None,
                    help="adapters kept read in memory (default: --max-loras)")
    add_tracing_args(parser)
    r = parser.add_argument_group("request limits (what one request may ask for; more is a 400)")
    r.add_argument("--max-n", type=positive_int, default=d.max_n, help="sequences per prompt (n)")
    r.add_argument("--max-logprobs", type=non_negative_int, default=d.max_logprobs,
                   help="top logprobs per token (logprobs, top_logprobs)")
    r.add_argument("--max-stop-strings", type=positive_int, default=d.max_stop_strings, help="stop strings")
    r.add_argument("--max-stop-string-chars", type=positive_int, default=d.max_stop_string_chars,
                   help="characters of one stop string")
    r.add_argument("--max-stop-token-ids", type=positive_int, default=d.max_stop_token_ids, help="stop_token_ids")
    r.add_argument("--max-request-tokens", type=positive_int, default=d.max_request_tokens,
                   help="n x max_tokens x (1 + logprobs), summed over the prompts of one request")
    r.add_argument("--max-constraint-chars", type=positive_int, default=d.max_constraint_chars,
                   help="characters of one request's output constraint (JSON schema, regex, grammar, choices)")


def add_tracing_args(parser: argparse.ArgumentParser) -> None:
    """--otlp-traces-endpoint (vLLM's flag): the engine core's and the HTTP frontend's alike."""
    parser.add_argument_group("tracing (docs: serving/metrics-and-tracing)").add_argument(
        "--otlp-traces-endpoint", default=None, metavar="URL",
        help="send OpenTelemetry spans (one per request, with the engine core's as its child) to this OTLP "
             "collector, e.g. http://localhost:4317; the protocol is $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (grpc, "
             "or http/protobuf), the other OTEL_* variables apply (default: no tracing)")


def engine_args_from(ns: argparse.Namespace) -> EngineArgs:
    fields = EngineArgs.__struct_fields__
    return EngineArgs(**{f: getattr(ns, f) for f in fields if hasattr(ns, f)})
