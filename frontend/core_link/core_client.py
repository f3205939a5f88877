"""How the frontend reaches an engine core. The in-process client runs the core in this process
(debugging, `LLM(multiprocess=False)`), through the frontend's seam (engine_seam.py)."""

from common.config import EngineArgs
from common.lora import LoRARequest
from common.wire_messages import EngineCoreOutputs, EngineCoreRequest
from frontend.core_link import engine_seam


class EngineDeadError(RuntimeError):
    """The engine core died or stopped answering; no request can be served until it is back."""


class InprocClient:
    def __init__(self, args: EngineArgs):
        self.core = engine_seam.start_inproc_core(args)
        self.model_info = self.core.model_info()

    def add_request(self, request: EngineCoreRequest) -> None:
        self.core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.core.abort_requests(request_ids)

    def get_output(self) -> EngineCoreOutputs:
        return self.core.step()

    def add_lora(self, lora: LoRARequest) -> None:
        self.core.add_lora(lora)

    def remove_lora(self, lora: LoRARequest) -> bool:
        return self.core.remove_lora(lora)

    def reset_prefix_cache(self) -> bool:
        return self.core.reset_prefix_cache()

    def get_stats(self):
        return self.core.scheduler.get_stats()

    def shutdown(self) -> None:
        self.core.shutdown()
