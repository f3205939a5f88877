"""POST /v1/chat/completions: the plan of a chat request, its rendering, its answer read back."""
