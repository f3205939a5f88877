"""The HTTP API's endpoints, one package per API (chat, completions, responses, embeddings, tokenize), each
owning its request model, its handler and its answer model. What several share lies below them:
`openai_schemas` (the body models they build on) and `serving` (the server's state, errors and the run of a
request's prompts through the engine)."""
