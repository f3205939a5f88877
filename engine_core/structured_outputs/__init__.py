"""Constrained decoding in the engine core, with llguidance.

- grammar_compiler.py: one compile per constraint, in a worker thread, cached; the busy loop never waits.
- request_grammar.py: a request's matcher: ready or not, the tokens it allows, each accepted token.
- token_masks.py: the allowed-token bitmasks of a step's constrained rows, filled in parallel, and applied
  to the logits in one vectorized update.

The frontend checks every constraint before it sends it (common/structured_outputs.py); a constraint that
still fails here (another frontend, the offline API) fails its request with an ERROR output, never the core.
"""
