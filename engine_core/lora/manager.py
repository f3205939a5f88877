"""The adapters a model runner serves: max_loras slots on the device, filled on demand, least recently used first
out; adapters read from disk are kept (max_cpu_loras of them, LRU) so a slot refills without reading again.

Each step names the adapters of every running request (StepInput.lora_requests: the scheduler keeps them at most
max_loras) and which sequence uses which. `prepare` makes them all resident, evicting only adapters no running
request uses, and returns which rows use which slot (a LoRAStep) for the layers (forward_context.lora_step).
Every tensor-parallel rank runs the same `prepare` on the same steps, so their slots agree.
"""

import logging
from collections import OrderedDict

import torch

from common.lora import LoRARequest
from engine_core.distributed.parallel_state import tp_rank
from engine_core.engine_config import LoRAConfig
from engine_core.families.spec import ModelSpec
from engine_core.lora.layers import LoRALayer, LoRAStep
from engine_core.lora.peft_adapter import PeftAdapter, read_peft_adapter

logger = logging.getLogger("nvllm")


def attach_lora_layers(model, config: LoRAConfig, device: torch.device, dtype: torch.dtype) -> list[LoRALayer]:
    """Gives each q/k/v/o and dense gate/up/down layer of the decoder its LoRALayer (`layer.lora`); before the
    weights are packed, since a gate/up layer with LoRA keeps its projection unfused."""
    from engine_core.models.decoder import DecoderMLP  # a MoE block's experts take no adapter

    made = []

    def attach(linear, index, pieces, in_slice=None):
        in_features = linear.in_per_rank if in_slice is not None else linear.weight.shape[1]
        out_features = linear.weight.shape[0]
        linear.lora = LoRALayer(index, pieces, in_features, out_features, config.max_loras, config.max_lora_rank,
                                in_slice, device, dtype)
        made.append(linear.lora)

    for index, layer in enumerate(model.layers):
        qkv = layer.self_attn.qkv_proj
        d, heads = qkv.head_dim, qkv.heads
        q_size, kv_size = qkv.num_heads * d, qkv.num_kv_heads * d
        attach(qkv, index, {"q_proj": (0, heads.q_start * d, q_size),
                            "k_proj": (q_size, heads.kv_start * d, kv_size),
                            "v_proj": (q_size + kv_size, heads.kv_start * d, kv_size)})
        o = layer.self_attn.o_proj
        attach(o, index, {"o_proj": (0, 0, o.weight.shape[0])}, (o.in_start, o.in_per_rank))
        if isinstance(layer.mlp, DecoderMLP):
            gate_up = layer.mlp.gate_up_proj
            (gate_start, gate_count), (up_start, up_count) = gate_up.shards
            attach(gate_up, index, {"gate_proj": (0, gate_start, gate_count),
                                    "up_proj": (gate_count, up_start, up_count)})
            down = layer.mlp.down_proj
            attach(down, index, {"down_proj": (0, 0, down.weight.shape[0])}, (down.in_start, down.in_per_rank))
    return made


class LoRAManager:
    def __init__(self, model, spec: ModelSpec, config: LoRAConfig, device: torch.device, dtype: torch.dtype):
        self.spec = spec
        self.config = config
        self.layers = attach_lora_layers(model, config, device, dtype)
        self.slots: list[tuple | None] = [None] * config.max_loras  # the adapter key in each slot
        self.last_used = [0] * config.max_loras
        self.clock = 0
        self.read_adapters: OrderedDict[tuple, PeftAdapter] = OrderedDict()
        self.device = device

    def read(self, lora: LoRARequest) -> PeftAdapter:
        """The adapter's factors, read and checked now unless kept from before. ValueError naming it."""
        adapter = self.read_adapters.get(lora.key)
        if adapter is None:
            adapter = read_peft_adapter(lora.lora_name, lora.lora_path, self.spec, self.config.max_lora_rank)
            self.read_adapters[lora.key] = adapter
            while len(self.read_adapters) > self.config.max_cpu_loras:
                self.read_adapters.popitem(last=False)
        self.read_adapters.move_to_end(lora.key)
        return adapter

    def forget(self, lora: LoRARequest) -> None:
        """Drop the kept copy (an unloaded adapter); a slot holding it is reused once no running request needs it."""
        self.read_adapters.pop(lora.key, None)

    def _slot_for(self, lora: LoRARequest, pinned: set) -> int:
        key = lora.key
        if key in self.slots:
            return self.slots.index(key)
        free = [i for i, k in enumerate(self.slots) if k is None]
        candidates = free or [i for i, k in enumerate(self.slots) if k not in pinned]
        if not candidates:
            raise RuntimeError(f"no LoRA slot is free for {lora.lora_name!r}: the step's running requests use "
                               f"{len(pinned)} adapters, more than max_loras {self.config.max_loras}")
        slot = min(candidates, key=lambda i: self.last_used[i])
        adapter = self.read(lora)
        if self.slots[slot] is not None and tp_rank() == 0:
            logger.info("LoRA slot %d: %r replaces the least recently used adapter", slot, lora.lora_name)
        for layer in self.layers:
            layer.load(slot, adapter)
        self.slots[slot] = key
        return slot

    def prepare(self, lora_requests: list[LoRARequest], seq_loras: list[int],
                query_start_loc: list[int]) -> LoRAStep | None:
        """Makes the step's adapters resident; returns which rows use which slot (None: no row uses one)."""
        if not lora_requests:
            return None
        self.clock += 1
        pinned = {lora.key for lora in lora_requests}
        slots = [self._slot_for(lora, pinned) for lora in lora_requests]
        for slot in slots:
            self.last_used[slot] = self.clock
        rows, row_slots = [], []
        for seq, index in enumerate(seq_loras):
            if index >= 0:
                start, end = query_start_loc[seq], query_start_loc[seq + 1]
                rows.extend(range(start, end))
                row_slots.extend([slots[index]] * (end - start))
        if not rows:
            return None
        every = len(rows) == query_start_loc[-1]
        return LoRAStep(None if every else torch.tensor(rows, dtype=torch.int64, device=self.device),
                        torch.tensor(row_slots, dtype=torch.int64, device=self.device), frozenset(row_slots))
