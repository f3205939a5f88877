"""POST /tokenize and POST /detokenize with the served model's tokenizer (and chat template),
capped like prompts (--max-prompt-chars; token lists in schemas.py), big ones off the event loop."""

from common.errors import InvalidParameter
from common.validation import check_token_ids
from frontend.endpoints.chat.plan import plan_chat
from frontend.endpoints.chat.render import render_chat
from frontend.endpoints.serving import offload
from frontend.endpoints.serving.errors import bad_request
from frontend.endpoints.serving.state import ServerState
from frontend.endpoints.tokenize.schemas import (DetokenizeRequest, DetokenizeResponse, TokenizeChatRequest,
                                                 TokenizeCompletionRequest, TokenizeResponse)


async def tokenize(state: ServerState, body: TokenizeCompletionRequest | TokenizeChatRequest) -> TokenizeResponse:
    engine = state.ready_engine()
    state.check_model(body.model)
    if isinstance(body, TokenizeChatRequest):
        try:
            plan = plan_chat(body, engine.tokenizer, state.chat)
        except InvalidParameter as e:
            raise bad_request(e) from None
        _, ids = await render_chat(state, engine, body.messages, plan, body.add_generation_prompt)
    else:
        state.check_chars(len(body.prompt), "prompt")
        prompt, special = body.prompt, body.add_special_tokens
        ids = await offload.run(lambda: engine.tokenizer.encode(prompt, add_special_tokens=special), len(prompt))
    return TokenizeResponse(count=len(ids), max_model_len=engine.model_info.max_model_len, tokens=ids)


async def detokenize(state: ServerState, body: DetokenizeRequest) -> DetokenizeResponse:
    engine = state.ready_engine()
    state.check_model(body.model)
    tokens = body.tokens

    def work() -> str:
        try:
            check_token_ids("tokens", tokens, engine.limits)
        except InvalidParameter as e:
            raise bad_request(e) from None
        return engine.tokenizer.decode(tokens)

    return DetokenizeResponse(prompt=await offload.run(work, len(tokens), offload.BIG_TOKEN_LIST))
