"""Prompts and token ids as the endpoints take them, and the caps on element counts that bound a body's work.

Ranges are declared in the models so /openapi.json shows them; SamplingParams.validate() checks the same
limits again (and the cross-field ones) before a request reaches the engine.
"""

from typing import Annotated

from pydantic import Field, PlainValidator

from frontend.endpoints.openai_schemas.body_types import Text, shape_error

INT32_MAX = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


# Caps on element counts, checked before any element is looked at; a body is at most
# --max-request-body-bytes anyway, these keep the work per request small and bounded.
MAX_PROMPTS = 1024  # strings or token-id lists in one `prompt` (and prompts x n, see serving/state.py)
MAX_TOKEN_IDS = 1 << 20  # token ids in one request's `prompt`, or in /detokenize's `tokens`
# hard ceilings on list sizes, checked before pydantic looks at the items; the engine's own limits
# (--max-stop-strings, --max-stop-token-ids) apply after, and may only be set below these
MAX_STOP = 4096  # stop strings
MAX_STOP_TOKEN_IDS = 65536
MAX_MESSAGES = 4096


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _check_token_ids(ids: list, where: str) -> list[int]:
    """Every element an int in [0, 2**31): checked with C-speed builtins, then one error naming the
    first bad element (never one error per element, which cost seconds for a long list)."""
    if set(map(type, ids)) <= {int} and (not ids or (min(ids) >= 0 and max(ids) <= INT32_MAX)):
        return ids
    i, bad = next((i, t) for i, t in enumerate(ids) if type(t) is not int or not 0 <= t <= INT32_MAX)
    raise shape_error(f"{where}[{i}] must be a token id (an integer in [0, 2**31)), got {_describe(bad)}")


def _check_text(text: str, where: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise shape_error(f"{where} must be valid UTF-8 text (it holds a lone surrogate)") from None
    return text


def _prompt(value, name: str = "prompt"):
    """A string, a list of strings, a list of token ids, or a list of lists of token ids; the
    first element decides which list it is. `name`: what the endpoint calls the field (its errors say it)."""
    if isinstance(value, str):
        return _check_text(value, name)
    if not isinstance(value, list):
        raise shape_error(f"{name} must be a string, a list of strings, a list of token ids or a list of "
                           f"lists of token ids, got {_describe(value)}")
    if not value:
        return value
    first = value[0]
    if type(first) is int:
        if len(value) > MAX_TOKEN_IDS:
            raise shape_error(f"{name} has {len(value)} token ids, more than {MAX_TOKEN_IDS}")
        return _check_token_ids(value, name)
    if not isinstance(first, (str, list)):
        raise shape_error(f"{name}[0] must be a string, a token id or a list of token ids, got {_describe(first)}")
    if len(value) > MAX_PROMPTS:
        raise shape_error(f"{name} is a list of {len(value)} prompts, more than {MAX_PROMPTS}")
    if isinstance(first, str):
        for i, p in enumerate(value):
            if not isinstance(p, str):
                raise shape_error(f"{name}[{i}] must be a string like {name}[0], got {_describe(p)}")
            _check_text(p, f"{name}[{i}]")
        return value
    total = 0
    for i, p in enumerate(value):
        if not isinstance(p, list):
            raise shape_error(f"{name}[{i}] must be a list of token ids like {name}[0], got {_describe(p)}")
        total += len(p)
        if total > MAX_TOKEN_IDS:
            raise shape_error(f"{name} holds more than {MAX_TOKEN_IDS} token ids")
        _check_token_ids(p, f"{name}[{i}]")
    return value


TokenIdList = list[TokenId]
PromptInput = Annotated[str | list[int] | list[str] | list[list[int]],  # the schema shows the four forms
                        PlainValidator(_prompt,
                                       json_schema_input_type=Text | TokenIdList | list[Text] | list[TokenIdList])]
