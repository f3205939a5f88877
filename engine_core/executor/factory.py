from engine_core.engine_config import EngineConfig


def executor_class_for(config: EngineConfig):
    """One process for TP=1 on one node; rank 0 here plus worker processes otherwise."""
    if config.parallel.is_single_process:
        from engine_core.executor.uniproc import UniprocExecutor
        return UniprocExecutor
    from engine_core.executor.multiproc import MultiprocExecutor
    return MultiprocExecutor
