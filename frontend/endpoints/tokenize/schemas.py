"""POST /tokenize and POST /detokenize: their request bodies (a prompt or a chat) and answers."""

from typing import Annotated

from pydantic import BaseModel, Discriminator, Field, PlainValidator, Tag

from frontend.endpoints.openai_schemas.body_types import StrictModel, Text, at_most, shape_error
from frontend.endpoints.openai_schemas.messages import ChatMessage
from frontend.endpoints.openai_schemas.prompt_fields import (MAX_MESSAGES, MAX_TOKEN_IDS, TokenIdList,
                                                             _check_token_ids, _describe)


def _detokenize_tokens(value):
    if not isinstance(value, list):
        raise shape_error(f"tokens must be a list of token ids, got {_describe(value)}")
    if len(value) > MAX_TOKEN_IDS:
        raise shape_error(f"tokens has {len(value)} token ids, more than {MAX_TOKEN_IDS}")
    return _check_token_ids(value, "tokens")


class TokenizeCompletionRequest(StrictModel):
    model: Text | None = None
    prompt: Text
    add_special_tokens: bool = True


class TokenizeChatRequest(StrictModel):
    model: Text | None = None
    messages: Annotated[list[ChatMessage], at_most(MAX_MESSAGES, "messages")] = Field(min_length=1)
    add_generation_prompt: bool = True


def _tokenize_form(body) -> str:
    return "chat-form" if isinstance(body, dict) and "messages" in body else "prompt-form"


# a body with `messages` is a chat, any other a prompt: errors then come from that form alone
TokenizeRequest = Annotated[Annotated[TokenizeCompletionRequest, Tag("prompt-form")]
                            | Annotated[TokenizeChatRequest, Tag("chat-form")], Discriminator(_tokenize_form)]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(StrictModel):
    model: Text | None = None
    tokens: Annotated[list[int], PlainValidator(_detokenize_tokens, json_schema_input_type=TokenIdList)] = Field(
        description=f"at most {MAX_TOKEN_IDS} token ids")


class DetokenizeResponse(BaseModel):
    prompt: str
