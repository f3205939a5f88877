"""POST /v1/completions: prompts as text or token ids, streamed or whole."""
