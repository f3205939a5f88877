"""A config struct from what a user gave: None, a dict (`LLM(x_config=...)`), JSON text (a CLI flag) or the struct
itself. One reader for every such config, so each says what is wrong the same way, naming the config and key."""

import json

import msgspec


def read_json_config(value, kind: type, name: str):
    """`kind` (a msgspec Struct) from `value`, or None; ValueError naming `name` and the bad key."""
    if value is None or isinstance(value, kind):
        return value
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {type(value).__name__}")
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as e:
        raise ValueError(f"{name}: {e}") from None
