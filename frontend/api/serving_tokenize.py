"""POST /tokenize and POST /detokenize with the served model's tokenizer (and chat template)."""

from frontend.api.errors import APIError
from frontend.api.protocol import (DetokenizeRequest, DetokenizeResponse, TokenizeChatRequest,
                                   TokenizeCompletionRequest, TokenizeResponse)
from frontend.api.serving_chat import render_chat
from frontend.api.state import ServerState


def tokenize(state: ServerState, body: TokenizeCompletionRequest | TokenizeChatRequest) -> TokenizeResponse:
    engine = state.ready_engine()
    state.check_model(body.model)
    if isinstance(body, TokenizeChatRequest):
        _, ids = render_chat(engine, body.messages, body.add_generation_prompt)
    else:
        ids = engine.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    return TokenizeResponse(count=len(ids), max_model_len=engine.model_info.max_model_len, tokens=ids)


def detokenize(state: ServerState, body: DetokenizeRequest) -> DetokenizeResponse:
    engine = state.ready_engine()
    state.check_model(body.model)
    vocab = engine.model_info.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"tokens: token id {bad} is outside the vocabulary [0, {vocab})", param="tokens")
    return DetokenizeResponse(prompt=engine.tokenizer.decode(body.tokens))
