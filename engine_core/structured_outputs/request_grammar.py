"""One request's constraint as the engine core follows it, token by token.

Life: created when the request arrives (its grammar compiling, or cached); the scheduler admits the request
only once `ready()`, and `start()` then copies the compiled start state (or reports why it did not compile).
Each step the sampler masks the request's row with `matcher`'s allowed tokens; the scheduler hands every
token the request keeps to `accept`. The request is done when the grammar is: after the token that
completes it (`terminated`), nothing but EOS could follow, so it finishes there.

Preemption needs nothing here: it frees the request's KV blocks but keeps its generated tokens, which the
matcher has consumed; recomputing them changes no state. A constraint with `starts_after_token_ids` (a
reasoning section first) is inactive, unmasked and fed nothing, until the output holds that sequence.
"""

from concurrent.futures import Future

from engine_core.structured_outputs.grammar_compiler import CompiledGrammar, first_line


class RequestGrammar:
    def __init__(self, compiled: "Future[CompiledGrammar]", starts_after_token_ids: list[int], field: str):
        self.compiled = compiled
        self._starts_after = list(starts_after_token_ids)
        self._tail: list[int] = []  # the last tokens seen while inactive, to find starts_after in
        self.field = field  # what the error names: structured_outputs.json, ...
        self.matcher = None  # llguidance.LLMatcher, once started
        self.active = not self._starts_after

    def ready(self) -> bool:
        return self.compiled.done()

    def start(self) -> str | None:
        """Take the compiled start state; the error (naming the field) when the constraint did not compile."""
        if self.matcher is not None:
            return None
        compiled = self.compiled.result()
        if compiled.start is None:
            return f"{self.field} cannot be compiled: {compiled.error}"
        self.matcher = compiled.start.deep_copy()
        return None

    @property
    def constrains(self) -> bool:
        """Whether the next token is masked."""
        return self.active and self.matcher is not None

    def accept(self, token: int) -> str | None:
        """Advance by one kept token; the error when the grammar cannot take it, which fails only this request.
        A masked row samples only tokens the mask allows, so this is the constraint asking for text the
        vocabulary cannot spell (a regex for a character whose lead byte no token holds: llguidance's mask
        then allows a token its parser refuses) or a parser limit: the request's constraint, named."""
        if not self.active:
            self._tail = (self._tail + [token])[-len(self._starts_after):]
            self.active = self._tail == self._starts_after
            return None
        if not self.matcher.consume_token(token):
            return (f"{self.field}: token {token} does not fit the grammar; the constraint asks for text this model's "
                    f"vocabulary cannot spell here ({first_line(self.matcher.get_error())})")
        return None

    @property
    def terminated(self) -> bool:
        """The grammar is complete and admits no further token."""
        return self.active and self.matcher is not None and self.matcher.is_stopped()
