"""What real OpenAI clients send, replayed against a real `nvllm serve` on the default model: the openai SDK's
agent loop (history kept as `message.model_dump()` and as the message objects), every message type built from
the openai package's own types, LangChain's ChatOpenAI, a LiteLLM-style body with OpenAI's own fields, the
completions combinations of echo, logprobs, n, stream and stream_options, min_tokens against every stop kind,
and a schema-driven fuzz: any request the schema allows gets a 200 or a 400 naming a field path of that request,
never a 500 or an error inside a stream."""

import json

import httpx
import openai
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from openai.types.chat import (ChatCompletionAssistantMessageParam, ChatCompletionContentPartImageParam,
                               ChatCompletionContentPartInputAudioParam, ChatCompletionContentPartRefusalParam,
                               ChatCompletionContentPartTextParam, ChatCompletionDeveloperMessageParam,
                               ChatCompletionFunctionMessageParam, ChatCompletionMessage,
                               ChatCompletionSystemMessageParam, ChatCompletionToolMessageParam,
                               ChatCompletionUserMessageParam)

from frontend.endpoints.chat.schemas import ChatCompletionRequest
from frontend.endpoints.completions.schemas import CompletionRequest
from tests.support.http_helpers import openai_client, serving
from tests.support.schema_strategies import from_model

pytestmark = pytest.mark.integration

MODEL = "SmolLM2-135M-Instruct"
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                                    "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                   "required": ["a", "b"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # n-gram speculation on: tokens then come several at a time, which stop strings and min_tokens must not see
    with serving(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
                 tmp_path_factory.mktemp("serve")) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server[0])


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server[0] + path, json=body, timeout=300)


def error_of(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


# ---- the openai SDK's agent loop ----------------------------------------------------------------------------

@pytest.mark.parametrize("keep", ["model_dump", "object"])
def test_agent_loop_keeps_history_as_the_sdk_returns_it(client, keep):
    """Three tool turns and an answer, the assistant turns appended as `model_dump()` dicts or as the SDK's
    message objects, which is how hand-written agent loops keep history."""
    messages = [{"role": "system", "content": "You add numbers with the add tool."},
                {"role": "user", "content": "Add 2 and 3, then add 4, then add 5."}]
    for _ in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD], tool_choice="required",
                                               parallel_tool_calls=False, temperature=0, max_tokens=60)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
        messages.append(message.model_dump() if keep == "model_dump" else message)
        call = message.tool_calls[0]
        args = json.loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    dumped = messages[2] if keep == "model_dump" else messages[2].model_dump()
    assert {"refusal", "annotations", "audio", "function_call"} <= set(dumped)  # what broke the loop before
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD], tool_choice="none",
                                            temperature=0, max_tokens=20)
    assert answer.choices[0].message.content
    # the same history streamed, with the last answer appended too
    messages.append(answer.choices[0].message.model_dump() if keep == "model_dump" else answer.choices[0].message)
    messages.append({"role": "user", "content": "Thanks."})
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens >= 1


def test_every_message_type_built_from_the_openai_types(client, server):
    text = ChatCompletionContentPartTextParam(type="text", text="Add 1 and 2.")
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    history = [
        ChatCompletionDeveloperMessageParam(role="developer", content="Be brief."),
        ChatCompletionSystemMessageParam(role="system", content=[ChatCompletionContentPartTextParam(
            type="text", text="You add numbers.")], name="rules"),
        ChatCompletionUserMessageParam(role="user", content=[text], name="ada"),
        ChatCompletionAssistantMessageParam(role="assistant", content=None, refusal=None, audio=None,
                                            tool_calls=[call], name="bot"),
        ChatCompletionToolMessageParam(role="tool", tool_call_id="call_1", content=[
            ChatCompletionContentPartTextParam(type="text", text="3")]),
        ChatCompletionAssistantMessageParam(role="assistant", content=[
            ChatCompletionContentPartTextParam(type="text", text="It is 3."),
            ChatCompletionContentPartRefusalParam(type="refusal", refusal="")]),
        ChatCompletionAssistantMessageParam(role="assistant", refusal="I cannot help with that."),
        ChatCompletionAssistantMessageParam(role="assistant", content="old style",
                                            function_call={"name": "add", "arguments": '{"a": 2, "b": 2}'}),
        ChatCompletionFunctionMessageParam(role="function", name="add", content="4"),
        ChatCompletionMessage(role="assistant", content="A reply with every field.", refusal=None, annotations=[
            {"type": "url_citation", "url_citation": {"start_index": 0, "end_index": 1, "title": "t",
                                                      "url": "https://example.com"}}]).model_dump(),
        ChatCompletionUserMessageParam(role="user", content="And 5 + 5?"),
    ]
    reply = client.chat.completions.create(model=MODEL, messages=history, temperature=0, max_tokens=5)
    assert reply.choices[0].message.content and reply.service_tier == "default"
    # the refusal and the old function call reach the prompt as text and as a call
    tokens = post(server, "/tokenize", {"messages": history})
    assert tokens.status_code == 200, tokens.text
    rendered = httpx.post(server[0] + "/detokenize", json={"tokens": tokens.json()["tokens"]}).json()["prompt"]
    assert "I cannot help with that." in rendered and '"a": 2' in rendered and "Be brief." in rendered
    # what a text-only model cannot take is a 400 naming the part
    image = ChatCompletionContentPartImageParam(type="image_url", image_url={"url": "https://example.com/a.png"})
    audio = ChatCompletionContentPartInputAudioParam(type="input_audio", input_audio={"data": "AAAA", "format": "wav"})
    for part, what in ((image, "image input"), (audio, "audio input")):
        bad = history[:-1] + [ChatCompletionUserMessageParam(role="user", content=[text, part])]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=bad, max_tokens=2)
        assert e.value.body["param"] == f"messages[{len(bad) - 1}].content[1]" and what in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey", "audio": {"id": "audio_1"}}])
    assert e.value.body["param"] == "messages[1].audio"


def test_deprecated_functions_are_answered_as_function_calls(client):
    functions = [ADD["function"]]
    messages = [{"role": "user", "content": "Add 7 and 8."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, functions=functions,
                                           function_call={"name": "add"}, temperature=0, max_tokens=40)
    choice = whole.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.function_call.name == "add"
    assert set(json.loads(choice.message.function_call.arguments)) == {"a", "b"}
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, functions=functions,
                                                 function_call={"name": "add"}, temperature=0, max_tokens=40,
                                                 stream=True))
    pieces = [c.choices[0].delta.function_call for c in chunks if c.choices and c.choices[0].delta.function_call]
    assert pieces[0].name == "add"
    assert "".join(p.arguments or "" for p in pieces) == choice.message.function_call.arguments
    assert chunks[-1].choices[0].finish_reason == "function_call"


# ---- LangChain -------------------------------------------------------------------------------------------

def test_langchain_chat_openai_with_history_tools_and_streaming(server):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server[0] + "/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=12,
                     max_retries=0, timeout=300)
    history = [SystemMessage("You are terse."), HumanMessage("Hi!"), AIMessage("Hello."),
               HumanMessage("Name a colour.")]
    reply = llm.invoke(history)
    assert isinstance(reply, AIMessage) and reply.content
    assert reply.response_metadata["finish_reason"] in ("stop", "length")
    streamed = list(llm.stream(history))
    assert "".join(chunk.content for chunk in streamed) == reply.content
    caller = ChatOpenAI(base_url=server[0] + "/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=60,
                        max_retries=0, timeout=300).bind_tools([ADD], tool_choice="add")
    asked = [HumanMessage("Add 20 and 22.")]
    called = caller.invoke(asked)
    assert called.tool_calls and called.tool_calls[0]["name"] == "add"
    args = called.tool_calls[0]["args"]
    follow_up = asked + [called, ToolMessage(content=str(args["a"] + args["b"]), tool_call_id=called.tool_calls[0]["id"])]
    assert llm.invoke(follow_up).content


# ---- OpenAI's own request fields -------------------------------------------------------------------------

def test_a_litellm_style_body_with_openai_fields(server):
    """The fields a client configured for OpenAI sends on its first call are accepted; metadata reaches the log."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_completion_tokens": 4,
            "temperature": 0, "store": False, "metadata": {"trace": "lite-42", "team": "ml"}, "service_tier": "auto",
            "reasoning_effort": "low", "verbosity": "low", "modalities": ["text"], "user": "u-1",
            "prediction": {"type": "content", "content": "Hi there"}, "prompt_cache_key": "k",
            "safety_identifier": "hashed-user", "parallel_tool_calls": True, "n": 1, "stream": False,
            "logprobs": False, "audio": None}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["service_tier"] == "default" and r.json()["choices"][0]["message"]["content"]
    log = server[1].log()
    assert f"request {r.json()['id']} metadata" in log and "lite-42" in log
    # the same without the hints gives the same answer: accepted and ignored means ignored
    plain = {k: v for k, v in body.items() if k not in ("store", "metadata", "service_tier", "verbosity", "prediction",
                                                        "prompt_cache_key", "safety_identifier", "modalities")}
    assert post(server, "/v1/chat/completions", plain).json()["choices"] == r.json()["choices"]
    for field, value, why in [("metadata", {str(i): "x" for i in range(17)}, "more than 16"),
                              ("web_search_options", {}, "web search"), ("service_tier", "gold", "service_tier"),
                              ("reasoning_effort", "extreme", "reasoning_effort")]:
        error = error_of(post(server, "/v1/chat/completions", {**body, field: value}))
        assert error["param"] == field and why in error["message"], error


# ---- completions: echo x logprobs x n x stream x stream_options ----------------------------------------------

def _joined(chunks: list[dict], n_choices: int) -> list[dict]:
    """Each choice's text and logprobs lists joined from streamed chunks."""
    out = [{"text": "", "logprobs": None, "finish_reason": None} for _ in range(n_choices)]
    for chunk in chunks:
        for c in chunk["choices"]:
            o = out[c["index"]]
            o["text"] += c["text"]
            if c["logprobs"] is not None:
                o["logprobs"] = o["logprobs"] or {k: [] for k in c["logprobs"]}
                for k, v in c["logprobs"].items():
                    o["logprobs"][k] += v
            o["finish_reason"] = c["finish_reason"] or o["finish_reason"]
    return out


def _events(server, body: dict) -> list[dict]:
    with httpx.stream("POST", server[0] + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks
    return chunks


@pytest.mark.parametrize("echo", [False, True])
@pytest.mark.parametrize("logprobs", [None, 0, 2])
@pytest.mark.parametrize("n", [1, 2])
def test_completions_echo_logprobs_n_whole_and_streamed(server, echo, logprobs, n):
    prompt = "The capital of France is"
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "echo": echo,
            "logprobs": logprobs, "n": n}
    whole = post(server, "/v1/completions", body)
    assert whole.status_code == 200, whole.text
    whole = whole.json()
    prompt_tokens = whole["usage"]["prompt_tokens"]
    assert whole["usage"]["completion_tokens"] == 4 * n
    for choice in whole["choices"]:
        assert choice["text"].startswith(prompt) == echo
        lp = choice["logprobs"]
        if logprobs is None:
            assert lp is None
            continue
        echoed, unscored = (prompt_tokens, 1) if echo else (0, 0)  # the prompt's first token has no logprob
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == echoed + 4
        assert lp["token_logprobs"][:unscored] == lp["top_logprobs"][:unscored] == [None] * unscored
        assert None not in lp["token_logprobs"][unscored:]
        assert all(len(top) <= logprobs + 1 for top in lp["top_logprobs"][unscored:])
        assert "".join(lp["tokens"]) == choice["text"]
        assert [b - a for a, b in zip(lp["text_offset"], lp["text_offset"][1:])] == [len(t) for t in lp["tokens"][:-1]]
    for include_usage in (False, True):
        extra = {"stream_options": {"include_usage": True}} if include_usage else {}
        chunks = _events(server, {**body, "stream": True, **extra})
        assert (chunks[-1]["usage"] is not None and chunks[-1]["choices"] == []) == include_usage
        if include_usage:
            assert chunks[-1]["usage"] == whole["usage"]
        joined = _joined(chunks, n)
        for streamed, choice in zip(joined, whole["choices"]):
            assert streamed["text"] == choice["text"] and streamed["finish_reason"] == "length"
            if logprobs is None:
                assert streamed["logprobs"] is None
            else:
                assert streamed["logprobs"]["tokens"] == choice["logprobs"]["tokens"]
                assert streamed["logprobs"]["text_offset"] == choice["logprobs"]["text_offset"]
                assert streamed["logprobs"]["token_logprobs"] == pytest.approx(choice["logprobs"]["token_logprobs"])


# ---- min_tokens against every stop kind ------------------------------------------------------------------

def _complete(server, **body) -> dict:
    r = post(server, "/v1/completions", {"temperature": 0, "max_tokens": 40, **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("stream", [False, True])
def test_min_tokens_holds_off_stop_strings(server, stream):
    prompt = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"
    free = _complete(server, prompt=prompt, ignore_eos=True)["choices"][0]["text"]
    word = free.split()[0]  # a stop string the model writes at once
    early = _complete(server, prompt=prompt, stop=[word])
    assert early["choices"][0]["finish_reason"] == "stop" and early["usage"]["completion_tokens"] < 10, early
    body = {"prompt": prompt, "stop": [word], "min_tokens": 20, "temperature": 0, "max_tokens": 40, "ignore_eos": True}
    if stream:
        chunks = _events(server, {**body, "stream": True, "stream_options": {"include_usage": True}})
        text, tokens = _joined(chunks, 1)[0]["text"], chunks[-1]["usage"]["completion_tokens"]
    else:
        held = _complete(server, **body)
        text, tokens = held["choices"][0]["text"], held["usage"]["completion_tokens"]
    assert tokens >= 20 and len(text) > len(early["choices"][0]["text"]) and text == free[:len(text)]


def test_min_tokens_holds_off_stop_token_ids_and_eos(server):
    prompt = "1, 2, 3, 4,"
    free = _complete(server, prompt=prompt, max_tokens=8, ignore_eos=True)["choices"][0]["text"]
    first = httpx.post(server[0] + "/tokenize", json={"prompt": free, "add_special_tokens": False}).json()["tokens"][0]
    early = _complete(server, prompt=prompt, stop_token_ids=[first])
    assert early["usage"]["completion_tokens"] == 1 and early["choices"][0]["stop_reason"] == first, early
    held = _complete(server, prompt=prompt, stop_token_ids=[first], min_tokens=6)
    assert held["usage"]["completion_tokens"] >= 6
    # EOS: a chat answer the model ends by itself
    chat = {"messages": [{"role": "user", "content": "Say just: yes"}], "temperature": 0, "max_tokens": 100}
    short = post(server, "/v1/chat/completions", chat).json()
    assert short["choices"][0]["finish_reason"] == "stop", short
    length = short["usage"]["completion_tokens"]
    longer = post(server, "/v1/chat/completions", {**chat, "min_tokens": length + 10}).json()
    assert longer["usage"]["completion_tokens"] >= length + 10


# ---- schema-driven fuzz ---------------------------------------------------------------------------------

# generation kept short: the fuzz is about shapes, not long outputs
SMALL = {"max_tokens": {"type": "integer", "minimum": 1, "maximum": 3},
         "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 3},
         "n": {"type": "integer", "minimum": 1, "maximum": 2},
         "min_tokens": {"type": "integer", "minimum": 0, "maximum": 3},
         "best_of": {"type": "integer", "minimum": 1, "maximum": 2}}


def _param_in_request(param: str, body: dict) -> bool:
    """Whether an error's param is a path into the body (messages[1].content[0].text): every step a key or an
    index the body has, but the last may be a field missing from an object there (a required field left out);
    keys are matched whole, so a key holding "." or "[" is still found."""
    rest, value, first = param, body, True
    while rest:
        if rest.startswith("["):
            end = rest.find("]")
            index = rest[1:end]
            if end < 0 or not index.isdigit() or not isinstance(value, list) or int(index) >= len(value):
                return False
            value, rest = value[int(index)], rest[end + 1:]
        else:
            if not first:
                if not rest.startswith("."):
                    return False
                rest = rest[1:]
            keys = [k for k in value if rest.startswith(k) and rest[len(k):len(k) + 1] in ("", ".", "[")] \
                if isinstance(value, dict) else []
            if not keys:
                return isinstance(value, dict) and bool(rest) and not any(c in rest for c in ".[")
            key = max(keys, key=len)
            value, rest = value[key], rest[len(key):]
        first = False
    return True


def _check_answer(server, path: str, body: dict) -> None:
    if body.get("stream"):
        with httpx.stream("POST", server[0] + path, json=body, timeout=300) as r:
            if r.status_code == 200:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
                assert events and events[-1] == "[DONE]", events
                chunks = [json.loads(e) for e in events[:-1]]
                failed = [c for c in chunks for choice in c.get("choices", []) if choice["finish_reason"] == "error"]
                assert not failed, (body, failed)
                for error in [c["error"] for c in chunks if "error" in c]:  # only a field of this request's
                    assert error["type"] == "invalid_request_error" and _param_in_request(error["param"], body), \
                        (body, error)
                return
            r.read()
    else:
        r = httpx.post(server[0] + path, json=body, timeout=300)
        if r.status_code == 200:
            return
    assert r.status_code == 400, (body, r.status_code, r.text)
    error = r.json()["error"]
    assert error["param"] and _param_in_request(error["param"], body), (body, error)


# no shrinking: every example is a round trip to the server, and the example found is readable as it is
@settings(max_examples=150, suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
@given(data=st.data())
def test_fuzz_chat_requests_get_200_or_a_400_naming_a_field(server, data):
    body = data.draw(from_model(ChatCompletionRequest, SMALL, required=("max_completion_tokens",)))
    body.pop("model", None)  # a wrong model name is a 404
    _check_answer(server, "/v1/chat/completions", body)


@settings(max_examples=150, suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
@given(data=st.data())
def test_fuzz_completion_requests_get_200_or_a_400_naming_a_field(server, data):
    body = data.draw(from_model(CompletionRequest, SMALL, required=("max_tokens",)))
    body.pop("model", None)
    _check_answer(server, "/v1/completions", body)


def test_a_constraint_the_vocabulary_cannot_spell_is_a_400_naming_it(server):
    """A regex for a character whose UTF-8 lead byte (0xF1) no token of SmolLM2 holds: llguidance's mask lets one
    token through that its parser then refuses. Found by the fuzz; it was a 500 ("the engine failed")."""
    body = {"prompt": "x", "max_tokens": 4, "guided_regex": "\U00040538"}
    error = error_of(post(server, "/v1/completions", body))
    assert error["param"] == "guided_regex" and "vocabulary" in error["message"] and \
        error["message"].startswith("guided_regex"), error
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "structured_outputs": {"regex": "\U00040538"}}
    assert error_of(post(server, "/v1/chat/completions", chat))["param"] == "structured_outputs.regex"
    with httpx.stream("POST", server[0] + "/v1/completions", json={**body, "stream": True}, timeout=300) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[-1]["error"]["param"] == "guided_regex" and events[-1]["error"]["type"] == "invalid_request_error"
    assert _complete(server, prompt="still serving", max_tokens=2)["choices"][0]["text"]
