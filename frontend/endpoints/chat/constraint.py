"""A chat request's output constraint, made to start after the model's reasoning."""

import msgspec

from common.structured_outputs import StructuredOutputsParams
from frontend.endpoints.chat.plan import ChatPlan
from frontend.output_parsers.reasoning import THINK_CLOSE


def with_constraint_after_reasoning(constraint: StructuredOutputsParams | None, plan: ChatPlan, prompt: str,
                                    tokenizer) -> StructuredOutputsParams | None:
    """The constraint, made to start after the model's reasoning when it will reason first: a reasoning
    format is on and the prompt has not closed the reasoning already (Qwen3 with thinking off). A
    constraint that spells out the reasoning's end itself covers the reasoning too."""
    if constraint is None or plan.reasoning_parser is None or prompt.rstrip().endswith(THINK_CLOSE):
        return constraint
    if THINK_CLOSE in (constraint.grammar or "") or THINK_CLOSE in (constraint.regex or ""):
        return constraint
    return msgspec.structs.replace(constraint,
                                   starts_after_token_ids=tokenizer.encode(THINK_CLOSE, add_special_tokens=False))
