"""What an attention backend declares it can serve, and the setup the selector holds against it.

The selector (selector.py) and the model runner read these declarations; nothing else in the engine
looks at which backend it has.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionSetup:
    """What a model runner asks of its attention backend; fixed for the runner's life."""
    device_type: str  # "cpu", "cuda", ...
    dtype: torch.dtype  # of the activations and the KV cache
    block_size: int  # tokens per KV cache block
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # key/value heads on this rank
    head_dim: int


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class BackendCapabilities:
    """What a backend serves. A field left at its default puts no limit there.

    Invariant: a backend whose unsupported_reason(setup) is None computes attention for every step of
    that setup (a backend may still hand single calls it declines to a slower path of its own)."""
    label: str = "this attention backend"  # how messages name it
    devices: frozenset[str] | None = None  # device types it runs on; None: any
    named_only_devices: frozenset[str] = frozenset()  # where it runs only when asked for by name (tests, debugging)
    dtypes: tuple[torch.dtype, ...] | None = None  # None: any
    block_size_multiple: int = 1  # KV blocks it reads: a multiple of this many tokens
    head_dim_multiple: int = 1
    max_head_dim: int | None = None
    max_group: int | None = None  # query heads per KV head
    cuda_graphs: bool = False  # reads every per-step value from device tensors, so decode steps can be captured
    # the C decoder loop (cpu_kernels/decoder/) may run the layers: same kernels, same bits
    fused_cpu_decoder: bool = False
    batch_invariant: bool = False  # with batch invariance on, a row's result depends on that row alone

    def runs_on(self, device_type: str, named: bool = False) -> bool:
        return (self.devices is None or device_type in self.devices
                or (named and device_type in self.named_only_devices))

    def unsupported_reason(self, setup: AttentionSetup, named: bool = False) -> str | None:
        """Why this backend cannot serve `setup`, in words a user can act on; None when it can.
        named: the user asked for it by name (named_only_devices count)."""
        if not self.runs_on(setup.device_type, named):
            return f"{self.label} runs on {' or '.join(sorted(self.devices))} only, and the device is {setup.device_type}"
        if self.dtypes is not None and setup.dtype not in self.dtypes:
            return (f"{self.label} runs in {' or '.join(map(_dtype_name, self.dtypes))} only, "
                    f"and --dtype is {_dtype_name(setup.dtype)}")
        if setup.block_size % self.block_size_multiple:
            return (f"{self.label} reads a paged KV cache only in blocks of a multiple of {self.block_size_multiple} "
                    f"tokens, and --block-size is {setup.block_size}")
        if setup.head_dim % self.head_dim_multiple or (self.max_head_dim is not None
                                                       and setup.head_dim > self.max_head_dim):
            up_to = f" up to {self.max_head_dim}" if self.max_head_dim is not None else ""
            return (f"{self.label} needs a head dim that is a multiple of {self.head_dim_multiple}{up_to}, "
                    f"and the model's is {setup.head_dim}")
        if self.max_group is not None and (setup.num_heads % setup.num_kv_heads
                                           or setup.num_heads // setup.num_kv_heads > self.max_group):
            return (f"{self.label} takes up to {self.max_group} query heads per KV head, and the model has "
                    f"{setup.num_heads} query heads over {setup.num_kv_heads} KV heads")
        return None
