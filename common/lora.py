"""A LoRA adapter named by a request (vLLM's `LoRARequest(lora_name, lora_int_id, lora_path)`).

It travels with the request on the wire (EngineCoreRequest.lora_request) and with each step to the
tensor-parallel workers, which load the adapter's files themselves. `key` is its identity everywhere
(the engine's slots, the prefix-cache hashes): two requests share an adapter only if all three agree.
"""

import msgspec

MAX_LORA_NAME_CHARS = 256
MAX_LORA_PATH_CHARS = 4096


class LoRARequest(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None  # vLLM's field; informational

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.lora_name, self.lora_int_id, self.lora_path)

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path


def parse_lora_module(text: str) -> tuple[str, str, str | None]:
    """One `--lora-modules` value: NAME=PATH, or vLLM's JSON form {"name": .., "path": .., "base_model_name": ..}.
    Returns (name, path, base model name or None); ValueError says what is wrong."""
    text = text.strip()
    if text.startswith("{"):
        try:
            spec = msgspec.json.decode(text, type=dict)
        except msgspec.DecodeError as e:
            raise ValueError(f"lora module {text!r} is not valid JSON: {e}") from None
        name, path = spec.get("name"), spec.get("path")
        unknown = set(spec) - {"name", "path", "base_model_name"}
        if unknown:
            raise ValueError(f"lora module {text!r} has unknown keys {sorted(unknown)}")
        base = spec.get("base_model_name")
    else:
        name, sep, path = text.partition("=")
        base = None
        if not sep:
            raise ValueError(f"lora module {text!r} must be NAME=PATH or JSON with name and path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise ValueError(f"lora module {text!r} needs a non-empty name and path")
    return name, path, base
