"""LoRA adapters: PEFT folders read and checked (peft_adapter.py), resident in slots (manager.py), applied by the
linear layers per group of rows that share one (layers.py)."""
