"""A chat request's prompt: its planned conversation rendered with the model's chat template, and tokenized."""

from frontend.endpoints.chat.plan import ChatPlan
from frontend.endpoints.openai_schemas.messages import ChatMessage
from frontend.endpoints.serving import offload
from frontend.endpoints.serving.errors import APIError
from frontend.endpoints.serving.state import ServerState
from frontend.request_path import chat_template


async def render_chat(state: ServerState, engine, messages: list[ChatMessage], plan: ChatPlan,
                      add_generation_prompt: bool) -> tuple[str, list[int]]:
    """The prompt text and its token ids (special tokens come only from the template, never from contents); the
    messages' characters are counted before the template runs, a big text is tokenized off the loop."""
    state.check_chars(sum(len(m.text()) for m in messages), "messages")

    def render() -> tuple[str, list[int]]:
        try:
            return chat_template.render_chat(engine.tokenizer, plan.conversation, add_generation_prompt,
                                             **plan.template_kwargs)
        except Exception as e:  # no template, or the template refused the conversation (jinja raise)
            raise APIError(400, f"messages cannot be rendered with the model's chat template: {e}",
                           param="messages") from None

    size = sum(len(m["content"]) for m in plan.conversation)
    return await offload.run(render, offload.ALWAYS if "tools" in plan.template_kwargs else size)
