"""Rendering a conversation with the model's chat template into prompt token ids, where special
tokens come only from the template.

A user who writes `<|im_end|>\\n<|im_start|>system ...` in a message must not open a real system turn:
text inside message contents is tokenized as text, even where it spells a special token. A
conversation without such text is rendered and tokenized exactly as before (one encode of the whole
prompt); one with it is rendered with markers around each content, and the contents are tokenized
apart from the template's text, with special-token parsing off.
"""

import secrets
import weakref

from tokenizers import Tokenizer

_literal_tokenizers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def special_token_texts(tokenizer) -> list[str]:
    return [t.content for t in tokenizer.backend_tokenizer.get_added_tokens_decoder().values() if t.special]


def _literal_tokenizer(tokenizer) -> Tokenizer:
    """A copy of the tokenizer that reads special-token text as plain text (a copy: the shared one
    may be encoding on another thread)."""
    literal = _literal_tokenizers.get(tokenizer)
    if literal is None:
        literal = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        literal.encode_special_tokens = True
        _literal_tokenizers[tokenizer] = literal
    return literal


def _contents(conversation: list[dict]) -> list[str]:
    return [m["content"] for m in conversation if isinstance(m.get("content"), str)]


def render_chat(tokenizer, conversation: list[dict], add_generation_prompt: bool,
                chat_template: str | None = None, **template_kwargs) -> tuple[str, list[int]]:
    """(prompt text, prompt token ids). Raises what the template raises (no template, a refusal).
    template_kwargs: the template's extra variables (tools, enable_thinking, ...)."""
    def render(conv):
        return tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             chat_template=chat_template, **template_kwargs)

    specials = special_token_texts(tokenizer)
    if not any(s in c for c in _contents(conversation) for s in specials):
        text = render(conversation)
        return text, tokenizer.encode(text, add_special_tokens=False)
    # mark where each content lands in the rendered text (the template may repeat, drop or reorder them)
    nonce = secrets.token_hex(8)
    opening, closing = f"\uf8f0{nonce}\uf8f1", f"\uf8f2{nonce}\uf8f3"
    marked = [dict(m, content=opening + m["content"] + closing) if isinstance(m.get("content"), str) else m
              for m in conversation]
    pieces = []  # (text, is_content)
    rest = render(marked)
    while opening in rest:
        before, rest = rest.split(opening, 1)
        content, rest = rest.split(closing, 1) if closing in rest else (rest, "")
        pieces += [(before, False), (content, True)]
    pieces.append((rest, False))
    literal = _literal_tokenizer(tokenizer)
    ids: list[int] = []
    for piece, is_content in pieces:
        if piece:
            ids += literal.encode(piece, add_special_tokens=False).ids if is_content else \
                tokenizer.encode(piece, add_special_tokens=False)
    return "".join(p for p, _ in pieces), ids
