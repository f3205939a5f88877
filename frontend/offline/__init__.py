"""Entry point: the offline `LLM` (llm.py), generating in this process without a server."""
