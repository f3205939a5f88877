"""Speculative decoding settings, in vLLM's form: `--speculative-config '{"method": "ngram", ...}'`.

Two ways to propose tokens, both checked by one forward pass of the target model:
- ngram: the tokens that followed the latest earlier occurrence of the sequence's last n tokens
  (prompt lookup; n from prompt_lookup_max down to prompt_lookup_min);
- draft_model: a small model with the target's vocabulary decodes the proposals (`"model": PATH`).
"""


import msgspec

from common.json_config import read_json_config

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16  # each proposed token is one more row every step verifies


class SpeculativeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    method: str = ""  # ngram | draft_model; empty: draft_model when `model` is given, else ngram
    num_speculative_tokens: int = 0
    prompt_lookup_max: int | None = None  # ngram: longest suffix looked up (default 4)
    prompt_lookup_min: int | None = None  # ngram: shortest (default 1)
    model: str | None = None  # draft_model: HF folder or GGUF file with the target's vocabulary
    # speculation stops while more requests than this run (verifying proposals costs each of them
    # compute that a large batch does not have to spare); None: always on
    disable_by_batch_size: int | None = None

    def __post_init__(self):
        if not self.method:
            self.method = "draft_model" if self.model else "ngram"
        if self.method == "ngram":
            self.prompt_lookup_max = self.prompt_lookup_max if self.prompt_lookup_max is not None else 4
            self.prompt_lookup_min = self.prompt_lookup_min if self.prompt_lookup_min is not None else 1

    def validate(self) -> None:
        checks = [
            (self.method in METHODS, "method", f"must be one of {', '.join(METHODS)}, got {self.method!r}"),
            (1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS, "num_speculative_tokens",
             f"must be from 1 to {MAX_SPECULATIVE_TOKENS}, got {self.num_speculative_tokens}"),
            (self.disable_by_batch_size is None or self.disable_by_batch_size >= 1, "disable_by_batch_size",
             f"must be at least 1, got {self.disable_by_batch_size}"),
        ]
        if self.method == "ngram":
            checks += [
                (self.prompt_lookup_min >= 1, "prompt_lookup_min", f"must be at least 1, got {self.prompt_lookup_min}"),
                (self.prompt_lookup_max >= self.prompt_lookup_min, "prompt_lookup_max",
                 f"must be at least prompt_lookup_min ({self.prompt_lookup_min}), got {self.prompt_lookup_max}"),
                (self.model is None, "model", "is for method draft_model, not ngram"),
            ]
        else:
            checks.append((bool(self.model), "model", "must name the draft model (an HF folder or a GGUF file)"))
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"speculative_config.{name} {why}")


def parse_speculative_config(value) -> SpeculativeConfig | None:
    """A SpeculativeConfig from what a user gave (common/json_config.py). Raises ValueError naming the bad key."""
    return read_json_config(value, SpeculativeConfig, "speculative_config")
