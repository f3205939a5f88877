"""The LoRA adapters an HTTP server serves by name: a request picks one by giving its name as `model`.

--lora-modules names them at start (each read and checked by the core before the server is ready); with
--allow-runtime-lora-updating, POST /v1/load_lora_adapter and /v1/unload_lora_adapter change the set while the
server runs, as vLLM's endpoints do. Each name gets its own int id, never reused, so an adapter loaded again
under an old name is a new adapter to the engine (its slots and prefix-cache blocks are not the old one's).
"""

import itertools

from common.lora import LoRARequest, parse_lora_module
from frontend.endpoints.serving.errors import APIError


class LoRAAdapters:
    def __init__(self, modules: list[str] = (), allow_runtime_updates: bool = False):
        self.allow_runtime_updates = allow_runtime_updates
        self._ids = itertools.count(1)
        self.by_name: dict[str, LoRARequest] = {}
        for text in modules:
            name, path, base = parse_lora_module(text)
            if name in self.by_name:
                raise ValueError(f"--lora-modules names {name!r} twice")
            self.by_name[name] = self.make(name, path, base)

    def make(self, name: str, path: str, base_model_name: str | None = None) -> LoRARequest:
        return LoRARequest(name, next(self._ids), path, base_model_name)

    def get(self, name: str) -> LoRARequest | None:
        return self.by_name.get(name)

    def __iter__(self):
        return iter(list(self.by_name.values()))

    async def load_static(self, engine) -> None:
        """The --lora-modules adapters, each checked by the engine; ValueError naming the first it refuses."""
        for lora in self:
            self._check_enabled(engine, lora.lora_name, exc=ValueError)
            await engine.add_lora(lora)

    def _check_enabled(self, engine, name: str, exc=None) -> None:
        if not engine.model_info.enable_lora:
            message = f"LoRA adapter {name!r}: the engine serves no LoRA adapters (start it with --enable-lora)"
            if exc is not None:
                raise exc(message)
            raise APIError(400, message, param="lora_name")

    async def load(self, engine, name: str, path: str, replace: bool = False) -> LoRARequest:
        """/v1/load_lora_adapter: a 400 for a name in use (unless `replace`: load_inplace), LoRA off, or an adapter
        the engine refuses. A replaced adapter's running requests finish with the old one."""
        if not name or not path:
            raise APIError(400, "lora_name and lora_path are both required", param="lora_name" if not name else
                           "lora_path")
        if name in self.by_name and not replace:
            raise APIError(400, f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        self._check_enabled(engine, name)
        lora = self.make(name, path)
        try:
            await engine.add_lora(lora)
        except ValueError as e:
            raise APIError(400, str(e), param="lora_path") from None
        if name in self.by_name and not replace:  # loaded meanwhile by another request
            raise APIError(400, f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        old = self.by_name.get(name)
        self.by_name[name] = lora
        if old is not None:
            await engine.remove_lora(old)
        return lora

    async def unload(self, engine, name: str) -> None:
        """/v1/unload_lora_adapter: a 404 for a name not loaded. Requests running on it finish with it."""
        lora = self.by_name.pop(name, None)
        if lora is None:
            raise APIError(404, f"The lora adapter '{name}' cannot be found.", param="lora_name",
                           code="lora_adapter_not_found")
        await engine.remove_lora(lora)
