"""Family: one declarative record per model family, and how it reads a config.json into a ModelSpec.

A family says what it fixes (Qwen2's q/k/v biases, Qwen3's q/k norms), which config fields it reads beyond
the ones every family reads, and which it knows never to change the outputs (with why). The rule for the rest:
a field transformers' own code for the architecture never reads (transformers_reads.py, derived from its source)
changes nothing and is ignored, with a debug line naming it; a field it reads that nvllm does not honour is
refused by name (spec.UnsupportedConfig), as is a quantized checkpoint, by its method (quantization.py).
"""

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from engine_core.families import config_fields
from engine_core.families.moe_fields import moe_values
from engine_core.families.quantization import refuse_quantized
from engine_core.families.spec import ModelSpec, UnsupportedConfig, activation_of, rope_of
from engine_core.families.transformers_reads import READS
from engine_core.families.windows import WINDOW_RULES

logger = logging.getLogger(__name__)

# fields every family reads (weights/model_folder.py fills the ones a config may leave out)
COMMON_FIELDS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
})
# sliding-window fields of the Qwen families (windows.py reads them)
SLIDING_FIELDS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str  # config.json's architectures entry
    model_type: str
    gguf_architecture: str | None  # llama.cpp's general.architecture; None: its GGUF files are not imported yet
    gguf_qk_permuted: bool  # llama.cpp stores q/k rows permuted for its own rotary layout
    qkv_bias: bool | None = None  # fixed by the family; None: the config's attention_bias says
    qk_norm: bool = False
    moe: str | None = None  # the mixture-of-experts layout its config uses (moe_fields.py): qwen | mixtral
    reads: frozenset[str] = frozenset()  # fields read beyond COMMON_FIELDS
    ignores: dict[str, str] = field(default_factory=dict)  # field -> why it never changes the outputs
    windows: str = "none"  # how its config names sliding-window layers: a windows.WINDOW_RULES key
    # the family's own fields read into ModelSpec values (name -> value), over the ones read for every family
    own_values: Callable[[dict], dict] | None = None
    # field -> (the one value nvllm implements, why): read, and refused by name at any other value
    fixed: dict[str, tuple[Any, str]] = field(default_factory=dict)
    rope_aliases: dict[str, str] = field(default_factory=dict)  # older rope type names -> the type transformers runs

    @property
    def transformers_reads(self) -> frozenset[str]:
        """The config fields transformers' code for this architecture reads (transformers_reads.py, by family
        name): the rest are ignored."""
        return READS[self.name]

    def handles(self, name: str) -> bool:
        """Whether nvllm reads `name` for this family, or knows it never changes the outputs."""
        return (name in COMMON_FIELDS or name in self.reads or name in self.ignores or name in self.fixed
                or name in config_fields.NEVER_CHANGE_OUTPUTS)

    def relevant(self, config: dict) -> dict:
        """config without the fields transformers never reads for this architecture (a debug line names each);
        the common fields stay, as weights/model_folder.py normalises them from any transformers version."""
        kept = {}
        for name, value in config.items():
            if name in COMMON_FIELDS or name in self.transformers_reads:
                kept[name] = value
            else:
                logger.debug("config.json field %r = %r: transformers' %s never reads it; ignored", name, value,
                             self.architecture)
        return kept

    def read(self, config: dict) -> ModelSpec:
        refuse_quantized(config)
        config = self.relevant(config)
        for name, value in config.items():
            fixed = self.fixed.get(name) or (None if self.handles(name) else config_fields.SHARED_FIXED.get(name))
            if fixed is not None and value != fixed[0]:
                raise UnsupportedConfig(name, value, fixed[1])
            if fixed is None and not self.handles(name):
                raise UnsupportedConfig(name, value, f"transformers' {self.architecture} reads it and nvllm does not "
                                        "implement it, so the outputs could differ")
        attention_bias = bool(config.get("attention_bias", False))
        qkv_bias = attention_bias if self.qkv_bias is None else self.qkv_bias
        if "qkv_bias" in self.reads:  # Qwen2-MoE's own switch (transformers 5 writes it; older configs lack it)
            qkv_bias = bool(config.get("qkv_bias", qkv_bias))
        spec = ModelSpec(
            family=self.name,
            architecture=self.architecture,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=config["num_attention_heads"],
            num_kv_heads=config["num_key_value_heads"],
            head_dim=config["head_dim"],
            max_position=config["max_position_embeddings"],
            norm_eps=float(config["rms_norm_eps"]),
            activation=activation_of(config.get("hidden_act", "silu")),
            qkv_bias=qkv_bias,
            # attention_bias biases o_proj too, in families whose q/k/v biases it decides (Llama, Qwen3)
            o_bias=attention_bias and self.qkv_bias is None,
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=self.qk_norm,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            rope=rope_of(config, partial_rotary="partial_rotary_factor" in self.reads, aliases=self.rope_aliases),
            layer_windows=WINDOW_RULES[self.windows](config),
            **moe_values(config, self.moe),
        )
        return spec if self.own_values is None else msgspec.structs.replace(spec, **self.own_values(config))
