"""Runs a scheduled step on the model and samples. One process (TP=1) here; the multiprocess
executor for tensor parallelism has the same interface."""

from engine_core.engine_config import EngineConfig
from engine_core.worker.model_runner import ModelRunner
from engine_core.sched.scheduler import SchedulerOutput
from engine_core.spec_decode.draft_model import DraftModel
from engine_core.worker.step_input import StepResult, build_step_input


class UniprocExecutor:
    def __init__(self, config: EngineConfig):
        self.runner = ModelRunner(config)
        self.block_size = config.block_size
        self.drafter = DraftModel(config) if config.draft_model is not None else None

    def num_blocks_for_budget(self) -> tuple[int, int]:
        """(blocks that fit the memory budget, bytes per block: a draft model's cache takes its share)."""
        per_block = self.runner.kv_bytes_per_block() + (self.drafter.kv_bytes_per_block() if self.drafter else 0)
        return max(0, self.runner.kv_cache_budget() // per_block), per_block

    def prompt_arithmetic(self) -> bool:
        """Whether the model computes prompt tokens with another arithmetic than output tokens (the prefix cache
        then keys blocks by their prompt tokens)."""
        return self.runner.prompt_arithmetic

    def initialize_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)
        if self.drafter:
            self.drafter.allocate_kv_cache(num_blocks)

    def execute_model(self, out: SchedulerOutput) -> StepResult:
        if self.drafter:
            self.drafter.propose(out.scheduled)
        planned = build_step_input(out, self.block_size)
        return self.runner.finish_step(planned, *self.runner.forward_step(planned.step))

    def forget_requests(self, request_ids) -> None:
        for rid in request_ids:
            self.runner.sampler.forget(rid)
            if self.runner.pooler is not None:
                self.runner.pooler.forget(rid)
            if self.drafter:
                self.drafter.forget(rid)

    def on_failure(self, wake) -> None:
        """Nothing runs beside this process that could fail on its own: `wake` is never called."""

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass
