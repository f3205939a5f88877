"""Request and response bodies of POST /v1/embeddings (OpenAI's shapes)."""

from typing import Annotated, Literal

from pydantic import BaseModel, Field, PlainValidator

from frontend.endpoints.openai_schemas.body_types import StrictModel, Text
from frontend.endpoints.openai_schemas.prompt_fields import MAX_PROMPTS, MAX_TOKEN_IDS, TokenIdList, _prompt

EmbeddingInput = Annotated[str | list[int] | list[str] | list[list[int]],
                           PlainValidator(lambda value: _prompt(value, "input"),
                                          json_schema_input_type=Text | TokenIdList | list[Text] | list[TokenIdList])]


class EmbeddingRequest(StrictModel):
    model: str | None = None
    input: EmbeddingInput = Field(description="a string, a list of strings, a list of token ids, or a list of lists "
                                              f"of token ids (at most {MAX_PROMPTS} inputs, {MAX_TOKEN_IDS} token ids)")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: a list of numbers; base64: the float32 little-endian bytes, base64-encoded")
    dimensions: int | None = Field(None, ge=1, description="keep the first N values and renormalise (Matryoshka "
                                                           "models only: their config.json says is_matryoshka)")
    user: str | None = Field(None, max_length=256, description="an id of the end user (not used)")


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
