"""The building blocks every request body shares: strict models, text the tokenizer and the wire can take,
and list caps checked before any item is validated."""

from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict
from pydantic_core import PydanticCustomError


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 text (it holds a lone surrogate)") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]  # what the tokenizer and the wire can take


class StrictModel(BaseModel):
    # unknown fields are refused, naming them; NaN and +-Infinity parse as JSON numbers in Python, and no
    # parameter means anything by them
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def shape_error(message: str) -> PydanticCustomError:
    """An error whose message names the field and element itself (errors.py shows it as it is)."""
    return PydanticCustomError("shape", message)


def null_only(why: str):
    """An after-validator for a field OpenAI defines that nvllm cannot honour: any value but null is refused,
    saying `why` (errors.py shows it as it is, or after the field's path when nested)."""
    def check(value):
        if value is not None:
            raise PydanticCustomError("unsupported", why)
        return value
    return AfterValidator(check)


def at_most(limit: int, name: str):
    """A before-validator: a list longer than `limit` is refused before its items are validated
    (pydantic's max_length counts only after validating every item)."""
    def check(value):
        if isinstance(value, list) and len(value) > limit:
            raise shape_error(f"{name} has {len(value)} items, more than {limit}")
        return value
    return BeforeValidator(check)
