"""The OpenAI-compatible HTTP API: FastAPI app, pydantic request/response models, metrics.

`build_app(...)` in app.py is the entry point; `serve_http(...)` in server.py runs it on uvicorn.
Nothing here imports torch.
"""
