"""What an HTTP request is called and asks for before any prompt is looked at: its id, and its body's
SamplingParams (or a 400 naming the field)."""

import uuid

from common.errors import InvalidParameter
from common.sampling_params import SamplingParams
from frontend.endpoints.serving.errors import bad_request


def new_request_id(prefix: str) -> str:
    """The id of one HTTP request; its prompts are its parts (common/request_ids.py)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def sampling_params(body) -> tuple[SamplingParams, str | None]:
    """The body's SamplingParams and the field that set its output constraint (what its errors name), or a
    400 naming the field (two output constraints at once)."""
    try:
        return body.to_sampling_params(), body.constraint()[1]
    except InvalidParameter as e:
        raise bad_request(e) from None
