"""tandem chat-template against Hugging Face transformers on the real Qwen chat templates.

The oracle is transformers' own apply_chat_template(tokenize=False) on a tokenizer whose only
role is to carry the special tokens: it normalises the messages (drops null-valued keys,
copies reasoning into reasoning_content) and renders with jinja2 configured the way
transformers configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its tojson/raise_exception/strftime_now). Every case must give the same bytes,
or fail in both with the same message.

Cases cover single and multi-turn chats, system prompts, tool schemas with nested parameters,
enums and Unicode, assistant tool calls with arguments as objects and as JSON strings, runs
of tool responses, reasoning in reasoning_content or inline <think> blocks, enable_thinking
true/false/unset, add_generation_prompt on/off, content as a list of text parts, Unicode and
emoji, empty strings, quotes, backslashes and control characters, and the templates' own
error paths. Interpreter snippets (filters, tests, loops, whitespace control, slicing,
namespaces, macros, tojson escaping, Python repr) are compared the same way.
"""
import json
import os
import subprocess

import pytest

transformers = pytest.importorskip("transformers", reason="Hugging Face transformers is not installed")
tokenizers = pytest.importorskip("tokenizers", reason="Hugging Face tokenizers is not installed")

SRC = os.environ.get("TANDEM_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.environ.get("TANDEM_BUILD_DIR", os.path.join(SRC, "build"))
TANDEM = os.path.join(BUILD, "tandem")
TEMPLATE_DIR = os.path.join(SRC, "tests", "data", "chat")  # the models' templates, as published
TEMPLATES = ["Qwen-Qwen3-0.6B.jinja", "Qwen3-Coder.jinja", "Qwen3.5-4B.jinja"]

PREFIX = "tandem chat-template: "


def hf_tokenizer(bos=None, eos=None):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0}
    for t in (bos, eos):
        if t is not None:
            vocab.setdefault(t, len(vocab))
    special = {}
    if bos is not None:
        special["bos_token"] = bos
    if eos is not None:
        special["eos_token"] = eos
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), **special)


HF = None


def render_hf(template, case, tok=None):
    global HF
    if tok is None:
        if HF is None:
            HF = hf_tokenizer()
        tok = HF
    kwargs = dict(case.get("kwargs") or {})
    if case.get("thinking") is not None:
        kwargs["enable_thinking"] = case["thinking"]
    try:
        text = tok.apply_chat_template(case["messages"], tools=case.get("tools"), chat_template=template,
                                       tokenize=False, add_generation_prompt=case.get("agp", True),
                                       continue_final_message=case.get("cont", False), **kwargs)
        return ("ok", text)
    except Exception as e:  # the template's own errors and jinja2's
        return ("error", str(e))


def run_tandem(args, stdin=None):
    return subprocess.run([TANDEM, "chat-template"] + args, input=stdin, capture_output=True, timeout=60)


def render_tandem(template_path, case, tmp_path, extra=()):
    mpath = tmp_path / "messages.json"
    mpath.write_text(json.dumps(case["messages"], ensure_ascii=False), encoding="utf-8")
    args = ["--template", str(template_path), "--messages", str(mpath)]
    if case.get("tools") is not None:
        tpath = tmp_path / "tools.json"
        tpath.write_text(json.dumps(case["tools"], ensure_ascii=False), encoding="utf-8")
        args += ["--tools", str(tpath)]
    if not case.get("agp", True):
        args.append("--no-generation-prompt")
    if case.get("cont"):
        args.append("--continue-final-message")
    if case.get("thinking") is not None:
        args += ["--enable-thinking", "true" if case["thinking"] else "false"]
    if case.get("kwargs"):
        args += ["--kwargs", json.dumps(case["kwargs"], ensure_ascii=False)]
    r = run_tandem(args + list(extra))
    if r.returncode == 0:
        return ("ok", r.stdout.decode("utf-8"))
    err = r.stderr.decode("utf-8")
    assert r.returncode == 1 and err.startswith(PREFIX) and err.endswith("\n"), (r.returncode, err)
    return ("error", err[len(PREFIX):-1])


@pytest.fixture(scope="module", autouse=True)
def tandem_built():
    if not os.path.exists(TANDEM):
        pytest.fail(f"{TANDEM} is not built (ninja -C {BUILD} tandem)")


# --- inputs ----------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.\n  Returns °C.  ",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Zürich\" or 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14.5},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "Search a directory tree.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": ["string", "null"], "description": "regex \\d+ or 'literal'"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "ext": {"type": "array", "items": {"type": "string"}},
                        "size": {"type": "object", "properties": {"min": {"type": "number"}}},
                    },
                },
                "recursive": {"type": "boolean", "nullable": True},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
BARE = {"name": "ping", "parameters": {"type": "object", "properties": {}}}
NO_DESC = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
EMOJI_TOOL = {"type": "function", "function": {
    "name": "react", "description": "Réagir avec un emoji 😀 — «vite»",
    "parameters": {"type": "object", "properties": {"emoji": {"type": "string", "enum": ["👍", "🎉", "\u2028"]}}}}}
TOOLS = [WEATHER, SEARCH]

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
S = lambda c: {"role": "system", "content": c}  # noqa: E731
T = lambda c: {"role": "tool", "content": c}  # noqa: E731


def call(name, arguments, wrapped=True, cid="call_1"):
    fn = {"name": name, "arguments": arguments}
    return {"id": cid, "type": "function", "function": fn} if wrapped else fn


NESTED_ARGS = {"city": "Zürich", "days": 3, "unit": None, "filters": {"ext": [".py", ".c"], "deep": {"x": [1, 2.5, -0.0]}},
               "flag": True, "off": False, "ratio": 1e-7, "big": 1e20, "count": 12345678901234, "text": "line1\nline2 \"q\" \\ 東京 😀"}

TOOL_TURN = [
    U("What's the weather in Paris and Tokyo?"),
    {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"}),
                                                         call("get_weather", {"city": "Tokyo", "unit": "celsius"}, cid="c2")]},
    T('{"temp": 18}'),
    T('{"temp": 22, "note": "humid"}'),
]

MESSAGE_SETS = {
    "single_user": [U("Hello!")],
    "system_user": [S("You are a helpful assistant."), U("Hi")],
    "multi_turn": [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."), A("Why did the chicken cross the road?"), U("Why?")],
    "system_multi_turn": [S("Be brief."), U("1+1?"), A("2"), U("2+2?")],
    "think_inline": [U("Solve x+1=2"), A("<think>\nx = 2 - 1\n</think>\n\nx = 1"), U("And x+2=3?")],
    "think_inline_last": [U("Solve x+1=2"), A("<think>\nsubtract 1\n</think>\n\nx = 1")],
    "think_no_open_tag": [U("q"), A("reasoning only\n</think>\n\nanswer")],
    "reasoning_field": [U("q1"), {"role": "assistant", "content": "a1", "reasoning_content": "r1\n"}, U("q2")],
    "reasoning_field_last": [U("q1"), {"role": "assistant", "content": "\na1", "reasoning_content": "  r1  "}],
    "reasoning_alias": [U("q1"), {"role": "assistant", "content": "a1", "reasoning": "via reasoning"}, U("q2"),
                        {"role": "assistant", "content": "a2", "thinking": "via thinking"}],
    "reasoning_null": [U("q"), {"role": "assistant", "content": "a", "reasoning_content": None}, U("q2")],
    "reasoning_empty": [U("q"), {"role": "assistant", "content": "a", "reasoning_content": ""}],
    "unicode": [S("Système: réponds en français 🇫🇷"), U("Ça va ? 日本語 테스트 😀👍🏽 \u200b زمان")],
    "empty_strings": [S(""), U(""), A(""), U("")],
    "special_chars": [U("quotes \"double\" and 'single', backslash \\ and \\n literal, tab\tand\nnewline"),
                      A("{{ not a template }} {% raw %} <|im_end|> \u0001 \u007f"), U("ok\r\nwindows")],
    "whitespace_content": [U("  padded  \n\n"), A("\n\n  answer with spaces  \n"), U("\t")],
    "long_chat": sum([[U(f"question {i}"), A(f"answer {i}")] for i in range(15)], []) + [U("last")],
    "extra_keys": [{"role": "user", "content": "hi", "name": "alice", "meta": {"k": [1, 2]}}],
    "tools_user": [U("Weather in Berlin?")],
    "tools_system_user": [S("You can call tools."), U("Find *.py files")],
    "tool_call_objects": [U("Weather?"), {"role": "assistant", "content": None,
                                          "tool_calls": [call("get_weather", NESTED_ARGS)]},
                          T("sunny"), A("It is sunny.")],
    "tool_call_with_content": [U("Weather?"), {"role": "assistant", "content": "Let me check.",
                                               "tool_calls": [call("get_weather", {"city": "Oslo"})]}, T("cold")],
    "tool_call_whitespace_content": [U("w?"), {"role": "assistant", "content": "  \n ",
                                               "tool_calls": [call("get_weather", {"city": "Rome"})]}, T("warm")],
    "tool_call_unwrapped": [U("ping"), {"role": "assistant", "content": "",
                                        "tool_calls": [call("ping", {"host": "example.org", "n": 3}, wrapped=False)]}, T("pong")],
    "tool_call_json_string": [U("Weather?"), {"role": "assistant", "content": "",
                                              "tool_calls": [call("get_weather", json.dumps({"city": "Paris", "days": 2}))]}, T("rain")],
    "tool_run_then_answer": TOOL_TURN + [A("Paris 18°C, Tokyo 22°C.")],
    "tool_run_then_prompt": TOOL_TURN,
    "multi_step_tools": [U("Plan a trip"),
                         {"role": "assistant", "content": "", "reasoning_content": "need weather",
                          "tool_calls": [call("get_weather", {"city": "Lima"})]},
                         T("hot"),
                         {"role": "assistant", "content": "", "reasoning_content": "now files",
                          "tool_calls": [call("search_files", {"query": "trip", "filters": {"ext": [".md"]}})]},
                         T("[]")],
    "tool_response_in_user": [U("first question"), A("first answer"),
                              U("<tool_response>\nresult\n</tool_response>")],
    "tool_first": [T("orphan result"), U("what was that?")],
    "args_scalars": [U("x"), {"role": "assistant", "content": "", "tool_calls": [call("f", {
        "t": True, "f": False, "n": None, "i": -3, "x": 3.0, "y": 0.1, "z": 1e-05, "big": 1e16, "s": "str", "e": "",
        "l": [1, "two", None], "d": {}, "nested": {"a": {"b": {"c": [True]}}}})]}, T("done")],
    "content_parts": [{"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "part two"}]}],
    "content_parts_system": [{"role": "system", "content": [{"type": "text", "text": "sys part"}]}, U("hi")],
    "content_parts_assistant": [U("q"), {"role": "assistant", "content": [{"type": "text", "text": "<think>r</think>a"}]}, U("q2")],
    "image_part": [{"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "what is this?"}]}],
    "no_user_query": [S("only system"), A("and assistant")],
    "system_not_first": [U("hi"), S("late system")],
    "unknown_role": [U("hi"), {"role": "critic", "content": "meh"}],
    "system_with_image": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}, U("hi")],
    "bad_content_item": [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}]}],
    "content_number": [{"role": "user", "content": 42}],
    "missing_content": [{"role": "user"}],
}

TOOL_SETS = {
    "tools_user": TOOLS, "tools_system_user": [SEARCH, BARE, NO_DESC, EMOJI_TOOL], "tool_call_objects": TOOLS,
    "tool_call_with_content": [WEATHER], "tool_call_unwrapped": [BARE], "tool_call_json_string": TOOLS,
    "tool_run_then_answer": TOOLS, "tool_run_then_prompt": TOOLS, "multi_step_tools": TOOLS,
}


def make_cases():
    cases = []
    for name, msgs in MESSAGE_SETS.items():
        cases.append((name, {"messages": msgs, "tools": TOOL_SETS.get(name)}))
    # generation prompt and thinking switches on a few shapes
    for name in ("single_user", "think_inline_last", "reasoning_field_last", "tool_run_then_prompt", "system_multi_turn"):
        for agp in (True, False):
            for thinking in (None, True, False):
                if agp and thinking is None:
                    continue  # the default, already above
                cases.append((f"{name}-agp{int(agp)}-think{thinking}",
                              {"messages": MESSAGE_SETS[name], "tools": TOOL_SETS.get(name), "agp": agp, "thinking": thinking}))
    cases.append(("vision_ids", {"messages": [{"role": "user", "content": [
        {"type": "image", "image": "a"}, {"type": "text", "text": "and"}, {"type": "video", "video": "v"}, {"type": "image_url", "image_url": "b"}]}],
        "kwargs": {"add_vision_id": True}}))
    cases.append(("kwargs_unused", {"messages": MESSAGE_SETS["single_user"], "kwargs": {"custom_flag": [1, {"a": None}]}}))
    cases.append(("tools_empty_list", {"messages": MESSAGE_SETS["single_user"], "tools": []}))
    cases.append(("tools_no_parameters", {"messages": MESSAGE_SETS["single_user"],
                                          "tools": [{"type": "function", "function": {"name": "noop", "description": "  spaces  "}}]}))
    return cases


CASES = make_cases()


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("name,case", CASES, ids=[c[0] for c in CASES])
def test_template_renders_like_transformers(template, name, case, tmp_path):
    path = os.path.join(TEMPLATE_DIR, template)
    text = open(path, encoding="utf-8").read()
    want = render_hf(text, case)
    got = render_tandem(path, case, tmp_path)
    assert got == want


@pytest.mark.parametrize("template", TEMPLATES)
def test_most_cases_render_rather_than_fail(template):
    # A comparison of two failures proves little: most cases must render in the oracle.
    text = open(os.path.join(TEMPLATE_DIR, template), encoding="utf-8").read()
    ok = sum(render_hf(text, case)[0] == "ok" for _, case in CASES)
    assert len(CASES) >= 60 and ok >= 45, (len(CASES), ok)


@pytest.mark.parametrize("name,message", [
    ("no_user_query", "No user query found in messages."),
    ("system_not_first", "System message must be at the beginning."),
    ("unknown_role", "Unexpected message role."),
    ("system_with_image", "System message cannot contain images."),
    ("bad_content_item", "Unexpected item type in content."),
    ("content_number", "Unexpected content type."),
    ("tool_call_json_string", "Can only get item pairs from a mapping."),
])
def test_qwen35_errors_carry_the_template_message(name, message, tmp_path):
    path = os.path.join(TEMPLATE_DIR, "Qwen3.5-4B.jinja")
    case = {"messages": MESSAGE_SETS[name], "tools": TOOL_SETS.get(name)}
    assert render_hf(open(path, encoding="utf-8").read(), case) == ("error", message)
    assert render_tandem(path, case, tmp_path) == ("error", message)


# continue_final_message: the prompt ends with the final message's text, left open. Where
# transformers refuses (no text to continue, a template that rewrites it), tandem refuses too,
# in its own words.
CONTINUE_SETS = {
    "plain": [U("Give me a word"), A("Ok! Here you go:")],
    "trailing_space": [U("q"), A("The answer is ")],
    "trailing_nbsp_newline": [U("q"), A("Ça\u00a0\n")],
    "leading_space": [U("q"), A("  indented")],
    "parts": [U("q"), {"role": "assistant", "content": [{"type": "text", "text": "first "}, {"type": "text", "text": "second"}]}],
    "think_open": [U("q"), A("<think>\nstep one")],
    "think_closed": [U("q"), A("<think>\nr\n</think>\n\nThe answer")],
    "reasoning_field": [U("q"), {"role": "assistant", "content": "so far", "reasoning_content": "r"}],
    "user_last": [U("Complete this senten")],
    "system_only": [S("sys")],
    "empty": [U("q"), A("")],
    "spaces_only": [U("q"), A("  \n")],
    "no_text_part": [U("q"), {"role": "assistant", "content": [{"type": "image", "image": "x.png"}]}],
    "no_content": [U("q"), {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Oslo"})]}],
}


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("name", list(CONTINUE_SETS))
def test_continue_final_message_like_transformers(template, name, tmp_path):
    path = os.path.join(TEMPLATE_DIR, template)
    case = {"messages": CONTINUE_SETS[name], "agp": False, "cont": True}
    want = render_hf(open(path, encoding="utf-8").read(), case)
    got = render_tandem(path, case, tmp_path)
    if want[0] == "ok":
        assert got == want
    else:
        assert got[0] == "error", (got, want)


def test_continue_final_message_cases_mostly_render():
    text = open(os.path.join(TEMPLATE_DIR, "Qwen3.5-4B.jinja"), encoding="utf-8").read()
    ok = [n for n, m in CONTINUE_SETS.items() if render_hf(text, {"messages": m, "agp": False, "cont": True})[0] == "ok"]
    assert len(ok) >= 8, ok


def test_continue_final_message_with_generation_prompt_is_refused(tmp_path):
    path = os.path.join(TEMPLATE_DIR, "Qwen3.5-4B.jinja")
    got = render_tandem(path, {"messages": CONTINUE_SETS["plain"], "cont": True}, tmp_path)
    assert got[0] == "error" and "add_generation_prompt" in got[1]


def test_qwen3_list_content_fails_like_python(tmp_path):
    # The template calls content.startswith() while it looks for the last user query.
    path = os.path.join(TEMPLATE_DIR, "Qwen-Qwen3-0.6B.jinja")
    case = {"messages": MESSAGE_SETS["content_parts"]}
    want = ("error", "'list object' has no attribute 'startswith'")
    assert render_hf(open(path, encoding="utf-8").read(), case) == want
    assert render_tandem(path, case, tmp_path) == want


# --- special tokens, model files, command line -------------------------------------------------

SPECIAL_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}" \
                   "{{ bos_token is defined }}/{{ eos_token is defined }}"


@pytest.mark.parametrize("bos,eos", [(None, None), ("<s>", None), (None, "<|im_end|>"), ("<|endoftext|>", "</s>")])
def test_special_tokens_are_template_variables(bos, eos, tmp_path):
    tpath = tmp_path / "t.jinja"
    tpath.write_text(SPECIAL_TEMPLATE)
    case = {"messages": [U("a"), A("b")], "agp": False}
    want = render_hf(SPECIAL_TEMPLATE, case, tok=hf_tokenizer(bos, eos))
    extra = (["--bos-token", bos] if bos else []) + (["--eos-token", eos] if eos else [])
    assert render_tandem(tpath, case, tmp_path, extra) == want
    assert want[0] == "ok"


def write_model(path, template, add_bos=None):
    gguf = pytest.importorskip("gguf", reason="gguf-py is not installed")
    w = gguf.GGUFWriter(str(path), "qwen35")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "<|endoftext|>", "<|im_end|>"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_model_file_template_and_tokens(tmp_path):
    text = open(os.path.join(TEMPLATE_DIR, "Qwen3.5-4B.jinja"), encoding="utf-8").read() + "{{ eos_token }}"
    path = tmp_path / "m.gguf"
    write_model(path, text)
    case = {"messages": MESSAGE_SETS["tool_run_then_answer"], "tools": TOOLS, "thinking": False}
    want = render_hf(text, case, tok=hf_tokenizer("<|endoftext|>", "<|im_end|>"))
    mpath = tmp_path / "msgs.json"
    mpath.write_text(json.dumps(case["messages"]))
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    r = run_tandem(["--model", str(path), "--messages", str(mpath), "--tools", str(tools), "--enable-thinking", "false"])
    assert r.returncode == 0, r.stderr
    assert ("ok", r.stdout.decode()) == want
    assert want[1].endswith("<|im_end|>")


@pytest.mark.parametrize("add_bos,bos", [(None, "<|endoftext|>"), (True, "<|endoftext|>"), (False, None)])
def test_model_bos_token_follows_add_bos_token(add_bos, bos, tmp_path):
    # llama.cpp writes Qwen's bos_token_id with add_bos_token = false; Hugging Face has no BOS then.
    path = tmp_path / "m.gguf"
    write_model(path, SPECIAL_TEMPLATE, add_bos)
    case = {"messages": [U("a")], "agp": False}
    want = render_hf(SPECIAL_TEMPLATE, case, tok=hf_tokenizer(bos, "<|im_end|>"))
    mpath = tmp_path / "msgs.json"
    mpath.write_text(json.dumps(case["messages"]))
    r = run_tandem(["--model", str(path), "--messages", str(mpath), "--no-generation-prompt"])
    assert r.returncode == 0, r.stderr
    assert ("ok", r.stdout.decode()) == want


def test_model_without_template_is_an_error(tmp_path):
    path = tmp_path / "m.gguf"
    write_model(path, None)
    mpath = tmp_path / "msgs.json"
    mpath.write_text(json.dumps([U("a")]))
    r = run_tandem(["--model", str(path), "--messages", str(mpath)])
    assert r.returncode == 1
    assert r.stderr.decode() == f"{PREFIX}{path}: the model has no tokenizer.chat_template\n"


def test_messages_from_stdin_and_exact_output(tmp_path):
    tpath = tmp_path / "t.jinja"
    tpath.write_text("{{ messages[0].content }}\n")  # jinja drops one trailing newline of the source
    r = run_tandem(["--template", str(tpath)], stdin=json.dumps([U("x\u00e9\n")]).encode())
    assert r.returncode == 0 and r.stdout == "x\u00e9\n".encode()


def test_request_body_gives_messages_and_tools(tmp_path):
    path = os.path.join(TEMPLATE_DIR, "Qwen3.5-4B.jinja")
    case = {"messages": MESSAGE_SETS["tool_run_then_answer"], "tools": TOOLS}
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": "m", "messages": case["messages"], "tools": TOOLS, "stream": True}))
    r = run_tandem(["--template", path, "--messages", str(body)])
    assert r.returncode == 0, r.stderr
    assert ("ok", r.stdout.decode()) == render_hf(open(path, encoding="utf-8").read(), case)


@pytest.mark.parametrize("args,code,needle", [
    ([], 2, "exactly one of --template and --model"),
    (["--template", "a", "--model", "b"], 2, "exactly one of --template and --model"),
    (["--template", "T", "--enable-thinking", "maybe"], 2, "expected true or false"),
    (["--template", "T", "--messages", "/nonexistent/m.json"], 1, "/nonexistent/m.json"),
    (["--template", "T", "--messages", "M", "--kwargs", "{bad"], 1, "--kwargs: invalid JSON"),
    (["--template", "T", "--messages", "M", "--kwargs", "{\"messages\": 1}"], 1, "'messages' is set by the chat itself"),
    (["--template", "T", "--messages", "EMPTY"], 1, "Cannot apply chat template to an empty conversation"),
    (["--template", "BROKEN", "--messages", "M"], 1, "template line 2: unexpected end of template"),
    (["--template", "T", "--messages", "BODY"], 1, "the request has no \"messages\""),
])
def test_command_line_errors(args, code, needle, tmp_path):
    (tmp_path / "T").write_text("{{ messages|length }}")
    (tmp_path / "BROKEN").write_text("{% for m in messages %}\n{{ m }}")
    (tmp_path / "M").write_text(json.dumps([U("x")]))
    (tmp_path / "EMPTY").write_text("[]")
    (tmp_path / "BODY").write_text("{\"model\": \"m\"}")
    args = [str(tmp_path / a) if a in ("T", "M", "EMPTY", "BROKEN", "BODY") else a for a in args]
    r = run_tandem(args)
    assert r.returncode == code, r.stderr
    assert needle in r.stderr.decode()
    assert r.stdout == b""


# --- interpreter semantics ------------------------------------------------------------------

VARS = {"xs": [1, 2, 3], "d": {"b": 1, "a": [1, 2.5, None, True]}, "s": "héllo wörld", "u8": "日本語😀",
        "n": None, "f": 1.5, "big": 1e20, "t": True, "e": "", "q": "it's \"quoted\" \\ \n\t\u0001"}

SNIPPETS = [
    # printing: Python str()/repr()
    "{{ xs }}|{{ d }}|{{ s }}|{{ n }}|{{ f }}|{{ big }}|{{ t }}|{{ e }}|{{ undefined_name }}|{{ (1, 2) }}|{{ (1,) }}",
    "{{ [q, 'a\\'b', \"x\\\"y\", '\\u00a0\\u200b\\x85\\x7f', u8] }}",
    "{{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123456789 }} {{ 1/3 }} {{ 2.0 }} {{ -0.0 }} {{ 5e-324 }}",
    "{{ d|string }}|{{ t|string }}|{{ n|string }}|{{ f|string }}|{{ xs|string }}|{{ 3|string }}",
    # tojson
    "{{ d|tojson }}|{{ xs|tojson }}|{{ s|tojson }}|{{ u8|tojson }}|{{ q|tojson }}|{{ big|tojson }}|{{ n|tojson }}",
    "{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=[',', ':']) }}|{{ [] |tojson(indent=2) }}",
    "{{ '\\u2028\\u007f\\u001f</script>'|tojson }}{{ 'é😀'|tojson(ensure_ascii=true) }}{{ [0.1, 1e22, -1.5e-10]|tojson }}",
    # slicing and string methods by code point
    "{{ s[::-1] }}|{{ s[1:3] }}|{{ s[-3:] }}|{{ u8[1] }}|{{ u8[::-2] }}|{{ xs[::-1] }}|{{ xs[1:] }}|{{ xs[-1] }}|{{ s[100:] }}",
    "{{ s|length }} {{ u8|length }} {{ xs|length }} {{ d|length }} {{ undefined_name|length }}",
    "{{ s.split(' ') }}{{ '  a  b  '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}",
    "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'hi\\n\\n'.rstrip('\\n') }}|{{ '\\u3000x\\xa0'|trim }}|",
    "{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith('lo') }}{{ 'Hello'.startswith(('x', 'H')) }}{{ 'abc'.find('c') }}"
    "{{ 'aaa'.count('a') }}{{ '-'.join(['a', 'b']) }}{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'abc'.replace('b', 'x') }}",
    "{{ 'hello world'|title }} {{ 'hello'|upper }} {{ 'HeLLo'|lower }} {{ 'hello'|capitalize }} {{ 'aXbX'|replace('X', 'y') }}",
    # operators
    "{{ 1 + 2 }} {{ 1 + 2.5 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 'a' * 3 }}{{ [1] * 3 }}{{ xs + [4] }}{{ 'a' + 'b' }}{{ 'abc' ~ 1 ~ none ~ true ~ 1.5 ~ xs }}",
    "{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ [1] == [1] }}{{ (1,) == [1] }}",
    "{{ 'a' in 'abc' }}{{ 2 in xs }}{{ 'a' in d }}{{ 'z' not in d }}{{ 'x' in undefined_name }}{{ not xs }}{{ xs and 'y' }}{{ e or 'dflt' }}",
    "{{ 'x' if t else 'y' }}{{ 'x' if n else 'y' }}{{ 'x' if n }}|{{ -f }}{{ +3 }}",
    # tests
    "{{ none is none }}{{ 1 is number }}{{ 'a' is string }}{{ d is mapping }}{{ xs is sequence }}{{ d is sequence }}"
    "{{ s is iterable }}{{ undefined_name is defined }}{{ undefined_name is undefined }}{{ undefined_name is sequence }}",
    "{{ false is false }}{{ 0 is false }}{{ true is true }}{{ true is number }}{{ true is integer }}{{ 1.0 is float }}"
    "{{ xs is not none }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'ab' is lower }}{{ 2 is in xs }}",
    # loops
    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}",
    "{% for x in xs %}{{ loop.previtem is defined }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }}{% else %}empty{% endfor %}{% for x in [] %}{% else %}none{% endfor %}",
    "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k, v in d.items() %}{{ k }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% for c in 'héllo' %}[{{ c }}]{% endfor %}{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% set y = 5 %}{% for i in xs %}{{ y }}{% set y = i %}{{ y }}{% endfor %}{{ y }}",
    # namespace, set, macros, with, filter blocks
    "{% set ns = namespace(a=1, b='x') %}{% for x in xs %}{% set ns.a = ns.a + x %}{% endfor %}{{ ns.a }}{{ ns.b }}{{ ns }}",
    "{% macro m(a, b=2, c='z') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='q') }}|{{ m(a=5) }}|{{ m() }}",
    "{% macro f() %}{{ y }}{% endmacro %}{% set y = 3 %}{{ f() }}{% macro g() %}{{ i }}{% endmacro %}{% for i in xs %}{{ g() }}{% endfor %}",
    "{% set x %}inner {{ 1 }}{% endset %}[{{ x }}]{% set z | upper %}inner{% endset %}[{{ z }}]{% filter upper %}abc{% endfilter %}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}{% set p, r = 1, 2 %}{{ p }}{{ r }}",
    # other filters
    "{{ xs|join(',') }}{{ xs|first }}{{ xs|last }}{{ xs|reverse|list }}{{ 'abc'|reverse }}{{ xs|sum }}{{ xs|min }}{{ xs|max }}",
    "{{ '42'|int }}{{ 'x'|int }}{{ 3.9|int }}{{ '3.5'|float }}{{ -3|abs }}{{ xs|map('string')|join }}{{ undefined_name|default('dflt') }}"
    "{{ e|default('dflt') }}{{ e|default('dflt', true) }}",
    "{{ {'b': 1, 'a': 2}|dictsort }}{{ ['b', 'A', 'a']|sort }}{{ [3, 1, 2]|sort(reverse=true) }}{{ [{'n': 2}, {'n': 1}]|map(attribute='n')|list }}"
    "{{ [1, 2, 3, 4]|select('odd')|list }}{{ [{'a': 1}, {'a': 0}]|selectattr('a')|list }}{{ ['a', 'A', 'b']|unique|list }}",
    "{{ 'x\\ny\\n'|indent(2) }}|{{ 'x\\ny'|indent(2, true) }}|{{ '<&>'|e }}|{{ 'x'|safe + '<' }}|{{ ('a'|safe) ~ '<' }}",
    # whitespace control
    "  {% if true %}\n  x\n  {% endif %}\n  y\n{# comment #}\na  {# c #}  b\n{%- set x = 1 -%}   q   {%+ if true %}r{% endif %}",
    "a\n  {% for x in xs %}\n    {{ x }}\n  {% endfor %}\nb\n{{- '  c  ' -}}  |  {{- 'd' }}\n{% raw %}{{ raw }}{% endraw %}\n",
    "\t{% if t %}\ttab\n\t{% endif %}\tafter\n{% if t -%}\n   \n  z   \n{%- endif %}\r\nwindows\r\n",
    # transformers' extras and less common built-ins
    "{% generation %}gen {{ xs[0] }}{% endgeneration %}|{{ strftime_now('%Y-%m-%d') }}|{{ dict(a=1, b=[2]) }}|{{ namespace(d) }}",
    "{% for x in [1, 1, 2, 2, 1] %}{{ loop.changed(x) }}{% endfor %}|{{ n|default('D') }}|{{ d|list }}|{{ d|attr('b') }}|{{ d.b }}{{ d['a'][1] }}",
    "{{ [{'n': 2}, {'m': 1}]|map(attribute='n', default=0)|list }}|{{ xs|min }}{{ xs|max }}|{{ ['b', 'A']|min }}|{{ xs.0 }}{{ s[-1] }}",
    "{% set a = [1, 2] %}{% set b = a + [3] %}{{ a }}{{ b }}{{ a|length }}{{ (a + b)|unique|list }}{{ xs.index(2) }}{{ xs.count(1) }}",
    "{{ '%s'|length }}{{ 'a\u00e9b'|upper }}{{ 'ABC'.lower() }}{{ 'x y'.title() }}{{ 'ab'.capitalize() }}{{ '  x'.isspace() }}{{ '12'.isdigit() }}",
    # string literals
    "{{ '\\u00e9\\x41\\101\\\\n' }}{{ \"a\" \"b\" 'c' }}{{ '\\é' }}",
    # errors with jinja2's messages
    "{{ xs[10].foo }}", "{{ d.zz.foo }}", "{{ undefined_name.foo }}", "{{ 'a' + 1 }}", "{{ 1 + 'a' }}", "{{ xs + 'a' }}",
    "{{ n.foo }}", "{{ 1 / 0 }}", "{{ xs.append(1) }}", "{% for a, b in [[1, 2], [3]] %}{% endfor %}",
    "{{ raise_exception('boom \"x\" \\u00e9') }}", "{{ 'a' < 1 }}", "{{ undefined_name + 1 }}", "{{ loop.index }}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}", "{{ range(200000)|length }}", "{{ 3 in 'abc' }}",
]


@pytest.mark.parametrize("snippet", SNIPPETS)
def test_interpreter_matches_jinja2(snippet, tmp_path):
    tpath = tmp_path / "t.jinja"
    tpath.write_bytes(snippet.encode("utf-8"))
    case = {"messages": [U("x")], "kwargs": VARS}
    assert render_tandem(tpath, case, tmp_path) == render_hf(snippet, case)
