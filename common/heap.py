"""The heap a service builds while it starts (imports, the model, the tokenizer) lives as long as the service: moved
out of the garbage collector's reach once started (gc.freeze), later collections only walk what requests allocate.
Without it a request that allocates many small objects (tracing spans) pays for walks over the startup heap."""

import gc


def freeze_startup_heap() -> None:
    gc.collect()
    gc.freeze()
