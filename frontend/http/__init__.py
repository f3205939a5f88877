"""Entry point: the OpenAI-compatible HTTP server. The FastAPI app with its routes (app.py), its middleware
(the connection cap, the API key and body limits, CORS, trace context) and uvicorn around it (server.py).

`build_app(...)` in app.py is the entry point; `serve_http(...)` in server.py runs it on uvicorn.
Nothing here imports torch.
"""
