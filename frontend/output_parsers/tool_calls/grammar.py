"""The llguidance Lark grammar that forces tool calls (tool_choice "required" or a named function).

Each allowed function is its own `%json` rule: an object whose "name" is that function's name as a
JSON const, followed by its arguments under that function's parameters schema, so a name always comes
with its own schema (and a schema's `$defs` stay at the root its `$ref`s point to). The JSON is
written the way the models write it, `{"name": "f", "arguments": {"a": 1}}` (", " and ": ", no other
whitespace), and the calls are wrapped in the format's own markup, so whatever the grammar admits the
format's parser reads back as calls, with nothing else around them:
  hermes       <tool_call>\\n{call}\\n</tool_call>, blocks joined by "\\n"
  llama3_json  {call} ("parameters" for the arguments), calls joined by "; "
  generic      <tool_call>[{call}, {call}]</tool_call>
With parallel_tool_calls false there is exactly one call. Building the text needs no llguidance.
"""

import json

_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_HOISTED = ("$defs", "definitions")


def _call_schema(function: dict, arguments_key: str) -> dict:
    params = dict(function.get("parameters") or {"type": "object"})
    hoisted = {k: params.pop(k) for k in _HOISTED if k in params}
    return {"type": "object",
            "properties": {"name": {"const": function["name"]}, arguments_key: params},
            "required": ["name", arguments_key], "additionalProperties": False,
            **hoisted, "x-guidance": _JSON_STYLE}


def _chosen(tools: list[dict], tool_choice) -> list[dict]:
    functions = [t.get("function", t) for t in tools]
    if tool_choice == "required":
        if not functions:
            raise ValueError('tool_choice "required" needs at least one tool')
        return functions
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = tool_choice.get("function", {}).get("name")
        chosen = [f for f in functions if f["name"] == name]
        if not chosen:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
        return chosen[:1]
    raise ValueError(f'no grammar for tool_choice {tool_choice!r}: only "required" or a named function')


def tool_call_grammar(tools: list[dict], tool_choice, parallel_tool_calls: bool, fmt: str) -> str:
    """The Lark grammar admitting only calls (of the chosen functions, with valid arguments) in `fmt`."""
    arguments_key = "parameters" if fmt == "llama3_json" else "arguments"
    functions = _chosen(tools, tool_choice)
    rules = [f"fn_{i}: %json " + json.dumps(_call_schema(f, arguments_key), ensure_ascii=False)
             for i, f in enumerate(functions)]
    if fmt == "hermes":
        call, joiner, before, after = "call", r'"\n"', "", ""
        rules.append(r'call: "<tool_call>\n" fn "\n</tool_call>"')
    elif fmt == "llama3_json":
        call, joiner, before, after = "fn", '"; "', "", ""
    elif fmt == "generic":
        call, joiner, before, after = "fn", '", "', '"<tool_call>[" ', ' "]</tool_call>"'
    else:
        raise ValueError(f"unknown tool call format {fmt!r}; known: generic, hermes, llama3_json")
    many = f" ({joiner} {call})*" if parallel_tool_calls else ""
    start = f"start: {before}{call}{many}{after}"
    return "\n".join([start, "fn: " + " | ".join(f"fn_{i}" for i in range(len(functions)))] + rules) + "\n"
