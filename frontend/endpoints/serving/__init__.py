"""What the endpoints share to serve a request: the server's state (engine, limits, admission, metrics, LoRA
adapters, chat options), the API errors, and a request's prompts made engine requests, run and answered."""
