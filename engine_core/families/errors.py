"""UnsupportedConfig: what reading a config.json raises for a field or value nvllm cannot honour."""

from typing import Any


class UnsupportedConfig(ValueError):
    """A config.json field nvllm does not know, or a value of it nvllm does not implement."""

    def __init__(self, field: str, value: Any, why: str):
        self.field, self.value = field, value
        super().__init__(f"config.json field {field!r} = {value!r}: {why}")
