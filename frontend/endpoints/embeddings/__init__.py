"""POST /v1/embeddings: pooled prompts."""
