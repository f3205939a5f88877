from common.config import EngineArgs


def executor_class_for(args: EngineArgs):
    """One process for TP=1 on one node; rank 0 here plus worker processes otherwise."""
    if args.tensor_parallel_size == 1 and args.nnodes == 1:
        from engine_core.executor import UniprocExecutor
        return UniprocExecutor
    from engine_core.executor_mp import MultiprocExecutor
    return MultiprocExecutor
