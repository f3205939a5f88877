"""Splitting a reasoning model's output into reasoning (`<think>...</think>`) and content.

Two parsers, by `--reasoning-parser` name:
  qwen3        the output may open with `<think>` (after whitespace); if it does, the text up to
               `</think>` is reasoning. Otherwise it is all content. (Qwen3 hybrid templates: the
               model writes `<think>` itself; with thinking off the template writes an empty block.)
  deepseek_r1  the output starts inside reasoning, the template having put `<think>` at the end of the
               prompt (DeepSeek-R1, Qwen3 "Thinking" templates): text up to `</think>` is reasoning.
               A `<think>` the model writes anyway at the start is skipped.
Either can be made to start inside reasoning or not (`starts_in_reasoning`); `prompt_opens_reasoning`
tells from the rendered prompt, which is the surest way when a template switches thinking per request.

Guarantees: reasoning and content are each stripped of leading and trailing whitespace (None when
empty); an output cut off before `</think>` is all reasoning from the point reasoning began; a marker
split across deltas is held back, never leaked; for any split into deltas, the joined deltas of `feed`
and `finish` equal what `split` returns for the whole text.
"""

from frontend.output_parsers.text_stream import TrimmedText, partial_suffix_len

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether the rendered prompt leaves the model inside a `<think>` block."""
    return prompt.rstrip().endswith(THINK_OPEN)


class ReasoningParser:
    name = ""
    default_starts_in_reasoning = False

    def __init__(self, starts_in_reasoning: bool | None = None):
        self.starts_in_reasoning = (self.default_starts_in_reasoning if starts_in_reasoning is None
                                    else starts_in_reasoning)
        self._buf, self._pos, self._state = "", 0, "start"  # start, reasoning, content
        self._reasoning, self._content = TrimmedText(), TrimmedText()

    def feed(self, delta: str) -> tuple[str | None, str | None]:
        """(reasoning delta, content delta), None for either when there is nothing new."""
        self._buf += delta
        return self._run(final=False)

    def finish(self) -> tuple[str | None, str | None]:
        return self._run(final=True)

    @classmethod
    def split(cls, text: str, starts_in_reasoning: bool | None = None) -> tuple[str | None, str | None]:
        parser = cls(starts_in_reasoning)
        (r1, c1), (r2, c2) = parser.feed(text), parser.finish()
        return ((r1 or "") + (r2 or "")) or None, ((c1 or "") + (c2 or "")) or None

    def _run(self, final: bool) -> tuple[str | None, str | None]:
        reasoning, content = "", ""
        buf = self._buf
        if self._state == "start":
            rest = buf[self._pos:].lstrip()
            if rest.startswith(THINK_OPEN):
                self._pos, self._state = len(buf) - len(rest) + len(THINK_OPEN), "reasoning"
            elif not final and THINK_OPEN.startswith(rest):  # empty, or maybe the start of <think>
                return None, None
            else:
                self._state = "reasoning" if self.starts_in_reasoning else "content"
        if self._state == "reasoning":
            at = buf.find(THINK_CLOSE, self._pos)
            if at == -1:
                end = len(buf) if final else len(buf) - partial_suffix_len(buf[self._pos:], THINK_CLOSE)
                reasoning, self._pos = self._reasoning.push(buf[self._pos:end]), end
            else:
                reasoning = self._reasoning.push(buf[self._pos:at])
                self._pos, self._state = at + len(THINK_CLOSE), "content"
        if self._state == "content":
            content, self._pos = self._content.push(buf[self._pos:]), len(buf)
        self._buf, self._pos = buf[self._pos:], 0  # keep only what is not handed out yet
        return reasoning or None, content or None


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    default_starts_in_reasoning = True


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    p.name: p for p in (Qwen3ReasoningParser, DeepSeekR1ReasoningParser)}


def reasoning_parser(name: str) -> type[ReasoningParser]:
    """The parser class called `name`; ValueError naming the known ones otherwise."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning parser {name!r}; known: {known}") from None


def reasoning_parser_for_template(chat_template: str | None) -> str | None:
    """None when the template never writes `<think>`; deepseek_r1 when its generation prompt (the text
    after its last `add_generation_prompt`) opens a `<think>` it does not also close (an empty block is
    Qwen3's thinking-off switch); qwen3 otherwise."""
    template = chat_template or ""
    if THINK_OPEN not in template:
        return None
    tail = template[template.rfind("add_generation_prompt"):] if "add_generation_prompt" in template else ""
    at = tail.find(THINK_OPEN)
    while at != -1:
        after = tail[at + len(THINK_OPEN):].replace("\\n", "\n").lstrip()
        if not after.startswith(THINK_CLOSE):
            return "deepseek_r1"
        at = tail.find(THINK_OPEN, at + 1)
    return "qwen3"
