"""Getting tools and tool history into a prompt.

For templates without tool support, nvllm writes the tools into the system turn itself (the generic
format), and rewrites tool history as plain text:
  - an assistant turn with calls shows them as `<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`
    after its text;
  - a tool result becomes a user turn `<tool_response>{"name": "f", "content": "..."}</tool_response>`
    ("name" from the call it answers, left out if unknown); consecutive results share one user turn,
    one line each.
For templates that take tools, history passes through in OpenAI's shape except that each call's
`function.arguments` becomes a dict, which is what HF templates (Qwen, Llama 3.1) expect: they write
it with `| tojson`.
"""

import json

TOOLS_PROMPT = """# Tools

You can call functions to help with the user's request. They are listed below as JSON, inside <tools></tools>:
<tools>
{tools}
</tools>

To call one or more of them, answer with only a JSON list of calls inside <tool_call></tool_call>:
<tool_call>[{{"name": "function name", "arguments": {{"argument name": "value"}}}}]</tool_call>
The arguments must match the function's parameters. Results come back inside <tool_response></tool_response>. \
If no function fits the request, answer normally, without <tool_call>."""


def _function(tool: dict) -> dict:
    fn = tool.get("function", tool)
    out = {"name": fn["name"]}
    if fn.get("description"):
        out["description"] = fn["description"]
    out["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def render_tools_system_prompt(tools: list[dict]) -> str:
    """The generic format's instructions (TOOLS_PROMPT) with the tools, OpenAI-shaped, listed as one JSON
    list of {"name", "description", "parameters"}. The same tools always give the same text."""
    listing = json.dumps([_function(t) for t in tools], ensure_ascii=False)
    return TOOLS_PROMPT.format(tools=listing)


def with_tools_in_system_turn(messages: list[dict], tools: list[dict]) -> list[dict]:
    """A copy of `messages` with the tools prompt leading the first system message, or, without one, as a
    new system message in front."""
    text = render_tools_system_prompt(tools)
    out = list(messages)
    for i, m in enumerate(out):
        if m.get("role") == "system":
            content = m.get("content")
            if isinstance(content, list):  # content parts
                content = [{"type": "text", "text": text + "\n\n"}] + content
            else:
                content = text + ("\n\n" + content if content else "")
            out[i] = dict(m, content=content)
            return out
    return [{"role": "system", "content": text}] + out


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _arguments(arguments):
    """Arguments as a dict (from the JSON string OpenAI sends), left as they are when not JSON."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def messages_for_template(messages: list[dict], takes_tools: bool) -> list[dict]:
    """OpenAI history made renderable: passed through with arguments as dicts when the template takes
    tools, rewritten as plain text (module docstring) when it does not."""
    names = {c.get("id"): c.get("function", {}).get("name")
             for m in messages for c in (m.get("tool_calls") or [])}
    out: list[dict] = []
    results_turn = None  # index in out of the user turn holding the latest tool results
    for m in messages:
        role, calls = m.get("role"), m.get("tool_calls")
        if takes_tools:
            if calls:
                m = dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=_arguments(
                    c["function"].get("arguments")))) for c in calls])
            elif role == "tool":
                m = dict(m, content=_text(m.get("content")))
                if "name" not in m and names.get(m.get("tool_call_id")):
                    m["name"] = names[m["tool_call_id"]]
            out.append(m)
        elif calls:
            listed = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                      for c in calls]
            text = _text(m.get("content"))
            block = "<tool_call>" + json.dumps(listed, ensure_ascii=False) + "</tool_call>"
            rest = {k: v for k, v in m.items() if k != "tool_calls"}
            out.append(dict(rest, content=text + "\n" + block if text else block))
        elif role == "tool":
            result = {"name": m.get("name") or names.get(m.get("tool_call_id")), "content": _text(m.get("content"))}
            if result["name"] is None:
                del result["name"]
            line = "<tool_response>" + json.dumps(result, ensure_ascii=False) + "</tool_response>"
            if results_turn == len(out) - 1:
                out[-1]["content"] += "\n" + line
            else:
                out.append({"role": "user", "content": line})
                results_turn = len(out) - 1
        else:
            out.append(dict(m, content=_text(m.get("content"))) if m.get("content") is None else m)
    return out
