"""The asynchronous engine the HTTP server talks to: AsyncLLM (async_llm.py) puts the request path and the
engine link together, and the router (engine_router.py) spreads requests over several engine cores."""
