"""How the server reads tool calls and reasoning out of chat outputs (`--tool-call-parser`,
`--reasoning-parser`); None: chosen from the model's chat template."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatOptions:
    tool_call_parser: str | None = None  # hermes | llama3_json | generic
    reasoning_parser: str | None = None  # qwen3 | deepseek_r1 | none

    def validate(self) -> None:
        """ValueError naming the flag and the known values."""
        from frontend.output_parsers.reasoning import REASONING_PARSERS
        from frontend.output_parsers.tool_calls import TOOL_PARSERS
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"--tool-call-parser {self.tool_call_parser!r}: known are {', '.join(sorted(TOOL_PARSERS))}")
        if self.reasoning_parser not in (None, "none", *REASONING_PARSERS):
            raise ValueError(f"--reasoning-parser {self.reasoning_parser!r}: known are none, "
                             f"{', '.join(sorted(REASONING_PARSERS))}")
