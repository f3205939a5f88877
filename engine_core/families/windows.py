"""Which layers attend through a sliding window, and how wide, read from config.json as transformers reads it.

A layer with window w lets the query at position p see keys p - w + 1 .. p (w keys, itself included):
transformers' sliding-window mask keeps kv_idx > q_idx - w on top of the causal one. Each rule returns one
entry per layer (the window, or None for a layer that attends to every key before it), or () where no
layer slides.
"""

from typing import Callable

from engine_core.families.spec import UnsupportedConfig

LAYER_TYPES = {"full_attention": False, "sliding_attention": True}


def _window_size(config: dict) -> int:
    window = config["sliding_window"]
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise UnsupportedConfig("sliding_window", window, "a window is a whole number of tokens, 1 or more")
    return window


def no_windows(config: dict) -> tuple[int | None, ...]:
    return ()


def qwen_windows(config: dict) -> tuple[int | None, ...]:
    """Qwen2/Qwen3: a window only with use_sliding_window; layer_types names the sliding layers where the
    config has it, else the layers from max_window_layers on slide."""
    num_layers = config["num_hidden_layers"]
    has_window = bool(config.get("use_sliding_window")) and config.get("sliding_window") is not None
    layer_types = config.get("layer_types")
    if layer_types is None:
        first = config.get("max_window_layers", 28)  # transformers' Qwen2Config / Qwen3Config default
        slides = [has_window and i >= first for i in range(num_layers)]
    else:
        if len(layer_types) != num_layers:
            raise UnsupportedConfig("layer_types", layer_types, f"names {len(layer_types)} layers of {num_layers}")
        unknown = [kind for kind in layer_types if kind not in LAYER_TYPES]
        if unknown:
            raise UnsupportedConfig("layer_types", unknown[0], f"nvllm implements {', '.join(LAYER_TYPES)} layers")
        # a sliding_attention layer without a window (use_sliding_window false) attends to all, as in transformers
        slides = [has_window and LAYER_TYPES[kind] for kind in layer_types]
    if not any(slides):
        return ()
    window = _window_size(config)
    return tuple(window if s else None for s in slides)


def every_layer_windows(config: dict) -> tuple[int | None, ...]:
    """Mistral, Mixtral, Phi-3: sliding_window (null: none) holds for every layer. A window as long as
    max_position_embeddings never binds (no position sees further back): every layer attends to all its keys."""
    window = config.get("sliding_window")
    if window is None or (isinstance(window, int) and window >= config["max_position_embeddings"]):
        return ()
    return (_window_size(config),) * config["num_hidden_layers"]


def qwen2_moe_windows(config: dict) -> tuple[int | None, ...]:
    """Qwen2-MoE: layer_types where the config has it (read as Qwen2's); else, with use_sliding_window, every other
    layer (0, 2, 4, ...) below max_window_layers slides, as transformers' Qwen2MoeConfig fills layer_types."""
    if config.get("layer_types") is not None or not config.get("use_sliding_window"):
        return qwen_windows(config)
    first_global = config.get("max_window_layers", 28)
    slides = [i % 2 == 0 and i < first_global for i in range(config["num_hidden_layers"])]
    return _per_layer(config, slides)


def qwen3_moe_windows(config: dict) -> tuple[int | None, ...]:
    """Qwen3-MoE: with use_sliding_window, every layer slides (transformers' Qwen3-MoE attention takes the one
    window in every layer, whatever max_window_layers says)."""
    if not config.get("use_sliding_window") or config.get("sliding_window") is None:
        return ()
    return (_window_size(config),) * config["num_hidden_layers"]


def _per_layer(config: dict, slides: list[bool]) -> tuple[int | None, ...]:
    if not any(slides):
        return ()
    window = _window_size(config)
    return tuple(window if s else None for s in slides)


WINDOW_RULES: dict[str, Callable[[dict], tuple[int | None, ...]]] = {
    "none": no_windows, "qwen": qwen_windows, "qwen2_moe": qwen2_moe_windows, "qwen3_moe": qwen3_moe_windows,
    "every_layer": every_layer_windows}
