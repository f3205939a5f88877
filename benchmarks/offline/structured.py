"""The JSON schema `nvllm bench throughput --structured-share` puts on a share of the requests, and the
cost of compiling it.

The schema is a typical extraction target (objects with typed, bounded, enumerated fields) whose
`minItems` keeps it open for longer than any output of the workload: constrained requests run to
max_tokens like the others, so both runs generate the same tokens and the throughput ratio is the
cost of the masks alone.
"""

import json
import random
import time

BENCH_SCHEMA = {
    "type": "array", "minItems": 64,
    "items": {"type": "object", "additionalProperties": False,
              "required": ["id", "name", "kind", "score", "tags"],
              "properties": {
                  "id": {"type": "integer", "minimum": 0},
                  "name": {"type": "string", "maxLength": 24},
                  "kind": {"type": "string", "enum": ["person", "place", "thing", "event"]},
                  "score": {"type": "number", "minimum": 0, "maximum": 1},
                  "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4}}}}


def constrained_indices(num_prompts: int, share: float, seed: int) -> set[int]:
    """Which requests carry the schema: round(share x num_prompts) of them, spread by the seed."""
    count = round(max(0.0, min(1.0, share)) * num_prompts)
    return set(random.Random(seed + 1).sample(range(num_prompts), count))


def compile_times(tokenizer_json: str, vocab_size: int, eos_token_ids: list[int]) -> dict:
    """Milliseconds llguidance takes for what the engine core does on a constraint's first request: the
    vocabulary index (once per core process) and the schema's compile (once per schema, then cached)."""
    import llguidance

    from common.structured_outputs import grammar_text
    start = time.perf_counter()
    tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))
    vocabulary = time.perf_counter() - start
    compiles = []
    for i in range(5):  # distinct schemas (no library cache between them)
        schema = dict(BENCH_SCHEMA, title=f"bench-{i}")
        start = time.perf_counter()
        matcher = llguidance.LLMatcher(tokenizer, grammar_text("json", json.dumps(schema)), log_level=0)
        compiles.append(time.perf_counter() - start)
        assert not matcher.is_error(), matcher.get_error()
    return {"vocabulary_ms": round(vocabulary * 1e3, 1), "schema_compile_ms": round(sorted(compiles)[2] * 1e3, 2)}
