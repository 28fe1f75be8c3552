"""End to end: `tandem serve` with the tiny test model and drafter (four real processes), driven
over HTTP with the official `openai` client and with raw requests.

Greedy answers are pinned against `tandem generate` (plain decoding in one process, no
drafter), so the whole pipeline - template, tokenizer, gateway, verifyd, draftd, kvd,
streaming - must reproduce the reference token for token. Bad requests must get 4xx with an
OpenAI error body and leave the server serving; 16 concurrent streams must each get exactly the
answer they get alone.

Runs `tandem serve` when the command exists, else the four daemons directly; skips (pytest exit
code 5) while they are not built."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the openai client is not installed")

SRC = Path(os.environ.get("TANDEM_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("TANDEM_BUILD_DIR", SRC / "build"))
TANDEM = BUILD / "tandem"
MODEL = SRC / "tests/data/models/qwen35-tiny-f32.gguf"
DRAFT = SRC / "tests/data/drafter/dflash-b16"
CTX = 1024  # positions per sequence: room for the tools prompt, small for the overflow test


DAEMONS = ("kvd", "verifyd", "draftd", "gateway")


def _have_serve():
    out = subprocess.run([str(TANDEM), "--help"], capture_output=True, text=True).stdout
    return any(line.split()[:1] == ["serve"] for line in out.splitlines())


def _have_pipeline():
    return TANDEM.exists() and all((BUILD / exe).exists() for exe in DAEMONS)


if not _have_pipeline():
    pytest.skip("the four daemons are not built yet", allow_module_level=True)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port, path, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _post(port, path, body, headers=None, timeout=60):
    """Raw POST of bytes: bodies the openai client would refuse to send."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request("POST", path, body=body, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _start(runtime, port, log):
    """`tandem serve` when it exists; until then the four daemons, as it would start them."""
    env = dict(os.environ, TANDEM_RUNTIME_DIR=runtime)
    common = dict(stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(SRC))
    if _have_serve():
        return [subprocess.Popen(
            [str(TANDEM), "serve", "--model", str(MODEL), "--draft", str(DRAFT), "--host",
             "127.0.0.1", "--port", str(port), "--ctx", str(CTX)], **common)]
    rt = ["--runtime-dir", runtime]
    cmds = [
        [BUILD / "kvd", *rt, "--slots", "16"],
        [BUILD / "verifyd", *rt, "--model", MODEL, "--draft", DRAFT, "--ctx", str(CTX)],
        [BUILD / "draftd", *rt, "--model", MODEL, "--draft", DRAFT],
        [BUILD / "gateway", *rt, "--model", MODEL, "--host", "127.0.0.1", "--port", str(port)],
    ]
    return [subprocess.Popen([str(a) for a in cmd], **common) for cmd in cmds]


@pytest.fixture(scope="module")
def server():
    runtime = tempfile.mkdtemp(prefix="tandem-e2e-")
    os.chmod(runtime, 0o700)
    port = _free_port()
    log_path = Path(runtime) / "serve.log"
    log = open(log_path, "wb")
    procs = _start(runtime, port, log)

    def logs():
        text = log_path.read_text(errors="replace")
        for f in sorted((Path(runtime) / "logs").glob("*.log")):
            text += f"\n--- {f.name} ---\n" + f.read_text(errors="replace")[-4000:]
        return text[-12000:]

    def stop():
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    deadline = time.time() + 120
    while True:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            stop()
            pytest.fail(f"{dead[0].args[0]} exited with {dead[0].returncode}:\n{logs()}")
        try:
            if _get(port, "/health", timeout=2)[0] == 200:
                break
        except OSError:
            pass
        if time.time() > deadline:
            stop()
            pytest.fail(f"/health never answered 200:\n{logs()}")
        time.sleep(0.2)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                           max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    yield {"port": port, "client": client, "model": model, "logs": logs}
    stop()
    log.close()
    # A daemon that exits badly on SIGTERM (a crash, a sanitizer report) fails the suite.
    bad = [(p.args[0], p.returncode) for p in procs if p.returncode not in (0, -signal.SIGTERM)]
    shutil.rmtree(runtime, ignore_errors=True)
    assert not bad, bad


def _reference_ids(prompt, n, *extra):
    """Greedy token ids of plain decoding in one process (comma-separated)."""
    return subprocess.run(
        [str(TANDEM), "generate", "--model", str(MODEL), "--draft", "", "--prompt", prompt, "-n",
         str(n), "--ignore-eos", "--ids", *extra], capture_output=True, text=True,
        check=True).stdout.strip()


def _reference(prompt, n, *extra):
    """Greedy text of plain decoding in one process, special tokens skipped as the API does."""
    ids = _reference_ids(prompt, n, *extra)
    return subprocess.run(
        [str(TANDEM), "detokenize", "--model", str(MODEL), ids, "--skip-special"],
        capture_output=True, text=True, check=True).stdout.rstrip("\n")


NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def _healthy(server):
    assert _get(server["port"], "/health")[0] == 200
    r = server["client"].completions.create(model=server["model"], prompt="ok", max_tokens=2,
                                            temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


# --- answers ------------------------------------------------------------------------------------


def test_models_lists_the_served_model(server):
    models = server["client"].models.list().data
    assert [m.id for m in models] == ["qwen35-tiny"]


def test_completion_equals_plain_greedy_decoding(server):
    prompt = "The quick brown fox"
    r = server["client"].completions.create(model=server["model"], prompt=prompt, max_tokens=16,
                                            temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].text == _reference(prompt, 16)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + 16


def test_completion_stream_equals_whole(server):
    c, m = server["client"], server["model"]
    args = dict(model=m, prompt="Once upon a time", max_tokens=20, temperature=0,
                extra_body={"ignore_eos": True})
    whole = c.completions.create(**args)
    chunks = list(c.completions.create(stream=True, stream_options={"include_usage": True},
                                       **args))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    assert len({ch.id for ch in chunks}) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_n_choices_each_equal_a_request_of_their_own(server):
    """Choice i of a seeded request with n is the one choice of the same request seeded
    seed + i; greedy choices are all the greedy text; streamed, each choice's pieces come under
    its index."""
    c, m = server["client"], server["model"]
    prompt = "Once upon a time"
    greedy = c.completions.create(model=m, prompt=prompt, max_tokens=12, temperature=0, n=3,
                                  extra_body={"ignore_eos": True})
    assert [ch.index for ch in greedy.choices] == [0, 1, 2]
    assert {ch.text for ch in greedy.choices} == {_reference(prompt, 12)}
    assert greedy.usage.completion_tokens == 36
    args = dict(model=m, messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=16, temperature=1.0, extra_body=NO_THINK)
    many = c.chat.completions.create(n=3, seed=40, **args)
    texts = [ch.message.content for ch in many.choices]
    for i in range(3):
        assert c.chat.completions.create(seed=40 + i, **args).choices[0].message.content == texts[i]
    assert len(set(texts)) > 1  # different seeds, different draws
    # best_of: the returned candidate is one of the draws, the likeliest per token of them
    best = c.completions.create(model=m, prompt=prompt, max_tokens=8, temperature=1.0, seed=5,
                                best_of=3, logprobs=0)
    draws = [c.completions.create(model=m, prompt=prompt, max_tokens=8, temperature=1.0,
                                  seed=5 + i, logprobs=0).choices[0] for i in range(3)]
    per_token = [sum(d.logprobs.token_logprobs) / len(d.logprobs.token_logprobs) for d in draws]
    assert best.choices[0].text == draws[per_token.index(max(per_token))].text
    assert best.usage.completion_tokens == sum(len(d.logprobs.tokens) for d in draws)
    streamed = ["", "", ""]
    for chunk in c.chat.completions.create(n=3, seed=40, stream=True, **args):
        for ch in chunk.choices:
            streamed[ch.index] += ch.delta.content or ""
    assert streamed == texts


def test_a_requests_own_chat_template_renders_its_prompt(server):
    """vLLM's chat_template: the chat answer is the completion of the text that template
    renders, token for token."""
    c, m = server["client"], server["model"]
    tmpl = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
    msgs = [{"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Name a colour."}]
    chat = c.chat.completions.create(model=m, messages=msgs, max_tokens=12, temperature=0,
                                     extra_body={"chat_template": tmpl, "ignore_eos": True})
    text = "system: Answer in one word.\nuser: Name a colour.\nassistant:"
    plain = c.completions.create(model=m, prompt=text, max_tokens=12, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    assert chat.choices[0].message.content == plain.choices[0].text
    status, body = _post(server["port"], "/v1/chat/completions", json.dumps(
        {"messages": msgs, "chat_template": "{% if %}"}).encode())
    err = _error(status, body, 400, "invalid_value")
    assert err["param"] == "chat_template"


def test_chat_usage_and_max_tokens(server):
    r = server["client"].chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": "Hello!"}], max_tokens=8,
        temperature=0, extra_body=dict(NO_THINK, ignore_eos=True))
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    u = r.usage
    assert u.completion_tokens == 8 and u.prompt_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens <= u.prompt_tokens
    assert 1.0 <= u.model_extra["acceptance_length"] <= 16.0


def test_chat_stream_follows_the_openai_shape(server):
    c, m = server["client"], server["model"]
    args = dict(model=m, messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=24, temperature=0, extra_body=dict(NO_THINK, ignore_eos=True))
    whole = c.chat.completions.create(**args)
    chunks = list(c.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                            **args))
    choice_chunks = [ch for ch in chunks if ch.choices]
    assert choice_chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].finish_reason is None for ch in choice_chunks[:-1])
    assert choice_chunks[-1].choices[0].finish_reason == "length"
    assert len({ch.id for ch in chunks}) == 1
    text = "".join(ch.choices[0].delta.content or "" for ch in choice_chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_thinking_output_streams_as_reasoning(server):
    """Qwen3.5's template opens <think> in the prompt: the random model never closes it, so all
    of its output is reasoning, streamed and whole alike."""
    c, m = server["client"], server["model"]
    args = dict(model=m, messages=[{"role": "user", "content": "Why?"}], max_tokens=12,
                temperature=0, extra_body={"ignore_eos": True})
    whole = c.chat.completions.create(**args).choices[0].message
    streamed = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                       for ch in c.chat.completions.create(stream=True, **args) if ch.choices)
    assert streamed == whole.model_extra.get("reasoning_content", "")


def test_stop_string_cuts_the_greedy_text(server):
    prompt = "The quick brown fox"
    full = _reference(prompt, 16)
    cut = len(full) // 2
    stop = full[cut:cut + 3]
    if not stop.strip() or full.find(stop) != cut:
        pytest.skip(f"no unique stop string in the middle of {full!r}")
    for stream in (False, True):
        args = dict(model=server["model"], prompt=prompt, max_tokens=16, temperature=0,
                    stop=[stop], extra_body={"ignore_eos": True})
        if stream:
            chunks = list(server["client"].completions.create(stream=True, **args))
            text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
        else:
            r = server["client"].completions.create(**args)
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert text == full[:cut]
        assert finish == "stop"


def test_penalties_and_logit_bias_equal_plain_decoding_with_them(server):
    prompt = "The quick brown fox"
    args = dict(model=server["model"], prompt=prompt, max_tokens=24, temperature=0,
                extra_body={"ignore_eos": True})
    plain = server["client"].completions.create(**args).choices[0].text
    r = server["client"].completions.create(presence_penalty=0.5, frequency_penalty=1.5,
                                            logit_bias={"11": 3, "279": -5}, **args)
    want = _reference(prompt, 24, "--presence-penalty", "0.5", "--frequency-penalty", "1.5",
                      "--logit-bias", "11=3,279=-5")
    assert r.choices[0].text == want
    assert want != plain  # the penalties changed the answer
    # a bias of 100 makes the answer one token over and over
    assert set(_reference_ids(prompt, 24, "--logit-bias", "279=100").split(",")) == {"279"}
    forced = server["client"].completions.create(logit_bias={"279": 100}, **args)
    assert forced.choices[0].text == _reference(prompt, 24, "--logit-bias", "279=100")
    # vLLM's repetition penalty and min_tokens
    rep = server["client"].completions.create(
        **dict(args, extra_body={"ignore_eos": True, "repetition_penalty": 1.6}))
    want = _reference(prompt, 24, "--repetition-penalty", "1.6")
    assert rep.choices[0].text == want and want != plain


def test_min_tokens_holds_off_the_end_of_generation(server):
    prompt = "def f():"  # the tiny model ends this one after 23 tokens
    ids = subprocess.run(
        [str(TANDEM), "generate", "--model", str(MODEL), "--draft", "", "--prompt", prompt, "-n",
         "40", "--ids"], capture_output=True, text=True, check=True).stdout.strip().split(",")
    assert len(ids) < 40
    args = dict(model=server["model"], prompt=prompt, max_tokens=40, temperature=0)
    r = server["client"].completions.create(**args)
    assert r.usage.completion_tokens == len(ids) and r.choices[0].finish_reason == "stop"
    least = len(ids) + 5
    r = server["client"].completions.create(**dict(args, extra_body={"min_tokens": least}))
    assert r.usage.completion_tokens >= least
    assert r.choices[0].text == _format_reference(prompt, 40, "--min-tokens", str(least))


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 130},
                         "score": {"type": "number", "minimum": 0.1, "exclusiveMaximum": 1},
                         "tags": {"type": "array", "maxItems": 2,
                                  "items": {"enum": ["a", "bc"]}}}}


def _format_reference(prompt, n, *extra):
    """Greedy text of plain decoding in one process with a response format, stopping at the end
    of generation as the server does."""
    ids = subprocess.run(
        [str(TANDEM), "generate", "--model", str(MODEL), "--draft", "", "--prompt", prompt, "-n",
         str(n), "--ids", *extra], capture_output=True, text=True, check=True).stdout.strip()
    out = subprocess.run(
        [str(TANDEM), "detokenize", "--model", str(MODEL), ids, "--skip-special"],
        capture_output=True, check=True).stdout  # bytes: a "\r" must stay one
    return out.decode("utf-8").removesuffix("\n")


def _check_person(value):
    assert set(value) <= {"name", "age", "score", "tags"} and {"name", "age"} <= set(value)
    assert "score" not in value or 0.1 <= value["score"] < 1
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 130
    assert all(t in ("a", "bc") for t in value.get("tags", []))


def test_response_format_equals_plain_decoding_with_it(server, tmp_path):
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(PERSON))
    c, m = server["client"], server["model"]
    for prompt in ("The quick brown fox", "Once upon a time"):
        for fmt, extra in (({"type": "json_object"}, ("--json",)),
                           ({"type": "json_schema", "json_schema": {
                               "name": "person", "strict": True, "schema": PERSON}},
                            ("--json-schema", str(schema_file)))):
            r = c.completions.create(model=m, prompt=prompt, max_tokens=48, temperature=0,
                                     extra_body={"response_format": fmt})
            text = r.choices[0].text
            assert text == _format_reference(prompt, 48, *extra)
            if r.choices[0].finish_reason == "stop":
                value = json.loads(text)
                assert isinstance(value, dict)
                if fmt["type"] == "json_schema":
                    _check_person(value)
            # streamed: the same text
            pieces = c.completions.create(model=m, prompt=prompt, max_tokens=48, temperature=0,
                                          stream=True, extra_body={"response_format": fmt})
            assert "".join(p.choices[0].text for p in pieces if p.choices) == text
    # chat, sampled: whatever is drawn stays a document of the schema
    for seed in range(4):
        r = c.chat.completions.create(
            model=m, messages=[{"role": "user", "content": "Who are you?"}], max_tokens=64,
            temperature=1.0, seed=seed, response_format={
                "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
            extra_body=NO_THINK)
        if r.choices[0].finish_reason == "stop":
            _check_person(json.loads(r.choices[0].message.content))


def _outside_strings(text):
    """The characters of a JSON text that are not inside a string."""
    out, inside, escaped = [], False, False
    for ch in text:
        if inside:
            inside, escaped = (escaped or ch != '"'), (not escaped and ch == "\\")
        elif ch == '"':
            inside = True
        else:
            out.append(ch)
    return "".join(out)


def test_structured_outputs_without_whitespace_and_with_closed_objects(server):
    """vLLM's structured_outputs options: disable_any_whitespace gives JSON with no whitespace
    outside its strings, disable_additional_properties keeps an open schema's objects to their
    declared keys; sampled answers, whole or cut by max_tokens, stay within both."""
    c, m = server["client"], server["model"]
    open_person = dict(PERSON)
    open_person.pop("additionalProperties", None)
    seen_ws = False
    for seed in range(6):
        for compact in (True, False):
            r = c.chat.completions.create(
                model=m, messages=[{"role": "user", "content": "Who are you?"}], max_tokens=64,
                temperature=1.0, seed=seed, extra_body=dict(NO_THINK, structured_outputs={
                    "json": open_person, "disable_any_whitespace": compact,
                    "disable_additional_properties": True}))
            text = r.choices[0].message.content
            rest = _outside_strings(text)
            if compact:
                assert not any(ch.isspace() for ch in rest), text
            seen_ws = seen_ws or any(ch.isspace() for ch in rest)
            if r.choices[0].finish_reason == "stop":
                _check_person(json.loads(text))
    assert seen_ws  # without the option the sampled answers do use whitespace


def test_stop_token_ids_end_the_generation_at_that_token(server):
    prompt = "The quick brown fox"
    ids = [int(x) for x in _reference_ids(prompt, 16).split(",")]
    stop = ids[5]
    cut = ids.index(stop) + 1  # its first occurrence, kept as the end-of-generation tokens are
    args = dict(model=server["model"], prompt=prompt, max_tokens=16, temperature=0,
                extra_body={"ignore_eos": True, "stop_token_ids": [stop]})
    r = server["client"].completions.create(**args)
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == cut
    want = subprocess.run([str(TANDEM), "detokenize", "--model", str(MODEL),
                           ",".join(map(str, ids[:cut])), "--skip-special"],
                          capture_output=True, text=True, check=True).stdout.rstrip("\n")
    assert r.choices[0].text == want
    chunks = list(server["client"].completions.create(stream=True, **args))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    err = _error(*_post(server["port"], "/v1/completions",
                        json.dumps({"prompt": "x", "stop_token_ids": [99999999]}).encode()),
                 400, "invalid_value")
    assert err["param"] == "stop_token_ids"


def test_logprobs_are_greedy_consistent(server):
    r = server["client"].chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": "Count"}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=3, extra_body=dict(NO_THINK, ignore_eos=True))
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 6
    for e in entries:
        tops = e.top_logprobs
        assert len(tops) == 3
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert all(t.logprob <= 0 for t in tops)
        # Greedy: the chosen token is the most likely one.
        assert e.token == tops[0].token and e.logprob == pytest.approx(tops[0].logprob)


def test_a_batch_of_prompts_answers_each_as_alone(server):
    """A list of prompts: the choices come prompt by prompt, n each, each the greedy answer of
    its prompt; usage sums the prompts."""
    c, m = server["client"], server["model"]
    prompts = ["The quick brown fox", "Once upon a time"]
    r = c.completions.create(model=m, prompt=prompts, max_tokens=8, temperature=0, n=2,
                             extra_body={"ignore_eos": True})
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert [ch.text for ch in r.choices] == [_reference(p, 8) for p in prompts for _ in (0, 1)]
    alone = [c.completions.create(model=m, prompt=p, max_tokens=1).usage.prompt_tokens
             for p in prompts]
    assert r.usage.prompt_tokens == sum(alone) and r.usage.completion_tokens == 32


def test_a_prediction_leaves_the_answer_and_is_counted(server):
    """A prediction never changes the answer: the greedy text comes back whether the prediction
    is that text (its tokens then taken as drafts, whole blocks at a time) or unrelated; usage
    says how many of its tokens were taken. A logit bias makes the answer a word repeated, a
    text that tokenizes back to the same tokens (the random model's own text does not)."""
    c, m = server["client"], server["model"]
    status, body = _post(server["port"], "/tokenize",
                         json.dumps({"content": " the", "add_special": False}).encode())
    word = json.loads(body)["tokens"]
    assert status == 200 and len(word) == 1
    args = dict(model=m, prompt="Once upon a time", max_tokens=40, temperature=0,
                logit_bias={str(word[0]): 100})
    want = c.completions.create(extra_body={"ignore_eos": True}, **args).choices[0].text
    assert want == " the" * 40
    for text in (want, "nothing like it at all " * 3):
        r = c.completions.create(**args, extra_body={
            "ignore_eos": True, "prediction": {"type": "content", "content": text}})
        assert r.choices[0].text == want
        d = r.usage.completion_tokens_details
        if text == want:  # after the prefill's token: 15 + 15 + the 7 left
            assert (d.accepted_prediction_tokens, d.rejected_prediction_tokens) == (37, 3)
        else:
            assert d.accepted_prediction_tokens < 5
    chat = dict(model=m, messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=24, temperature=0, logit_bias={str(word[0]): 100},
                extra_body=NO_THINK)
    plain = c.chat.completions.create(**chat).choices[0].message.content
    again = c.chat.completions.create(prediction={"type": "content", "content": plain}, **chat)
    assert again.choices[0].message.content == plain
    assert again.usage.completion_tokens_details.accepted_prediction_tokens > 15


def test_guided_choice_answers_with_one_of_the_strings(server):
    """vLLM's guided_choice / structured_outputs.choice: the answer is exactly one of the
    strings, then the end (the random model, sampled, writes nothing else); guided_json is a
    schema; a schema's pattern holds in the strings of the answer."""
    c, m = server["client"], server["model"]
    choices = ["positive", "negative", "neutral", "negative!"]
    for seed in range(4):
        for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
            r = c.completions.create(model=m, prompt="The review was", max_tokens=16,
                                     temperature=1.0, seed=seed, extra_body=extra)
            assert r.choices[0].text in choices and r.choices[0].finish_reason == "stop"
    r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "How old?"}],
                                  max_tokens=40, temperature=0,
                                  extra_body=dict(NO_THINK, guided_json={
                                      "type": "integer", "minimum": 3, "maximum": 9}))
    assert 3 <= json.loads(r.choices[0].message.content) <= 9
    schema = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 8,
                                                        "pattern": "^[A-Z]{2}-\\d{2,5}$"}},
              "required": ["code"], "additionalProperties": False}
    ends = 0
    for seed in range(4):
        r = c.chat.completions.create(
            model=m, messages=[{"role": "user", "content": "Code?"}], max_tokens=64,
            temperature=1.0, seed=seed, extra_body=NO_THINK,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "c", "schema": schema}})
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            assert re.fullmatch(r"[A-Z]{2}-[0-9]{2,5}", json.loads(text)["code"]), text
            ends += 1
    assert ends > 0


def test_structural_tags_hold_what_their_trigger_opens(server):
    """vLLM's structural_tag: free text until a trigger, then one of the structures it opens,
    whole (begin, JSON under its schema, end); the model, pushed to write the trigger, writes
    only such structures, through response_format and structured_outputs alike."""
    c, m = server["client"], server["model"]
    status, body = _post(server["port"], "/tokenize", json.dumps({"content": "<"}).encode())
    lt = json.loads(body)["tokens"]
    assert status == 200 and len(lt) == 1
    tags = {"type": "structural_tag", "triggers": ["<"],
            "structures": [{"begin": "<w>", "schema": {"enum": ["Paris", "Rome"]},
                            "end": "</w>"},
                           {"begin": "<n>", "schema": {"type": "integer", "minimum": 0,
                                                       "maximum": 99}, "end": "</n>"}]}
    valid = {"<w>": ("</w>", lambda v: v in ("Paris", "Rome")),
             "<n>": ("</n>", lambda v: isinstance(v, int) and 0 <= v <= 99)}

    def structures(text):
        """The whole structures of text; each "<" opens one (the last may be cut off)."""
        i = n = 0
        while (j := text.find("<", i)) >= 0:
            begin = text[j:j + 3]
            if begin not in valid:
                assert any(b.startswith(text[j:]) for b in valid), text  # cut off at the end
                break
            end, ok = valid[begin]
            k = text.find(end, j)
            if k < 0:
                break  # cut off by max_tokens
            assert ok(json.loads(text[j + 3:k])), text  # JSON (its whitespace allowed)
            i, n = k + len(end), n + 1
        return n

    newer = {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": tags["triggers"],
        "tags": [{"begin": t["begin"], "end": t["end"],
                  "content": {"type": "json_schema", "json_schema": t["schema"]}}
                 for t in tags["structures"]]}}
    for extra in ({"response_format": tags},
                  {"structured_outputs": {"structural_tag": json.dumps(tags)}},
                  {"response_format": newer}):
        r = c.chat.completions.create(
            model=m, messages=[{"role": "user", "content": "Where?"}], max_tokens=48,
            temperature=0, logit_bias={str(lt[0]): 100}, extra_body=dict(NO_THINK, **extra))
        text = r.choices[0].message.content
        assert text.startswith("<") and structures(text) >= 2, text
    status, body = _post(server["port"], "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "x"}], "response_format": dict(
            tags, triggers=["<", "<w"])}).encode())
    err = _error(status, body, 400, "unsupported_value")
    assert err["param"] == "response_format" and "holds or is held" in err["message"]


def test_a_grammar_or_a_regex_shapes_the_answer(server):
    """llama.cpp's grammar (GBNF), vLLM's guided_grammar (GBNF or Lark) / guided_regex and
    structured_outputs.grammar / .regex: the answer is a whole sentence, then the end (the
    random model, sampled, writes nothing else; the grammar's sentences are short enough to
    finish within max_tokens); a grammar the matcher refuses is a 400 that says why."""
    c, m = server["client"], server["model"]
    gbnf = 'root ::= ("yes" | "no") (", " [a-z]{1,4}){0,2} "."\n'
    lark = '?start: ("yes" | "no") (", " WORD)~0..2 "."  // Lark\nWORD: /[a-z]{1,4}/\n'
    regex = r"[A-Z][a-z]{1,3}-\d{2}"
    sentence = re.compile(r"(yes|no)(, [a-z]{1,4}){0,2}\.")
    serial = re.compile(r"[A-Z][a-z]{1,3}-[0-9]{2}")
    for seed in range(3):
        for extra, want in (({"grammar": gbnf}, sentence), ({"guided_grammar": gbnf}, sentence),
                            ({"structured_outputs": {"grammar": gbnf}}, sentence),
                            ({"guided_grammar": lark}, sentence),
                            ({"guided_regex": regex}, serial),
                            ({"structured_outputs": {"regex": regex}}, serial)):
            r = c.completions.create(model=m, prompt="Answer:", max_tokens=32, temperature=1.0,
                                     seed=seed, extra_body=extra)
            text = r.choices[0].text
            assert want.fullmatch(text) and r.choices[0].finish_reason == "stop", (extra, text)
    r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "Code?"}],
                                  max_tokens=32, temperature=0,
                                  extra_body=dict(NO_THINK, guided_regex=regex))
    assert serial.fullmatch(r.choices[0].message.content)
    err = _error(*_post(server["port"], "/v1/completions", json.dumps(
        {"model": m, "prompt": "x", "grammar": "root ::= root \"a\""}).encode()),
        400, "invalid_value")
    assert err["param"] == "grammar" and err["message"] == (
        "Invalid value for 'grammar': grammar: left recursion through the rule 'root' (it can "
        "reach itself before any character; so does an open repetition of what can be empty)")


def test_bad_words_never_come_back(server):
    """vLLM's bad_words: the greedy answer's first word, given as a bad word, no longer appears
    among the answer's tokens (with the drafter on, greedy output stays deterministic)."""
    c, m = server["client"], server["model"]
    ask = dict(model=m, prompt="Once upon a time", max_tokens=12, temperature=0, logprobs=0,
               extra_body={"ignore_eos": True})
    tokens = c.completions.create(**ask).choices[0].logprobs.tokens
    word = next(t for t in tokens if t.strip().isalpha())
    ask["extra_body"] = {"ignore_eos": True, "bad_words": [word.strip()]}
    again = c.completions.create(**ask).choices[0].logprobs.tokens
    assert word not in again and again != tokens, (word, tokens, again)


def test_allowed_token_ids_are_the_only_tokens(server):
    """vLLM's allowed_token_ids: every generated token is one of them, sampled too; an id
    outside the vocabulary is a 400."""
    c, m = server["client"], server["model"]
    ids = []
    for word in (" the", " a"):
        status, body = _post(server["port"], "/tokenize",
                             json.dumps({"content": word, "add_special": False}).encode())
        ids += json.loads(body)["tokens"]
    assert len(ids) == 2
    for temperature in (0, 1.0):
        r = c.completions.create(model=m, prompt="Once upon a time", max_tokens=12,
                                 temperature=temperature, seed=3,
                                 extra_body={"allowed_token_ids": ids, "ignore_eos": True})
        text = r.choices[0].text
        assert r.usage.completion_tokens == 12 and text.replace(" the", "").replace(" a", "") == ""
    err = _error(*_post(server["port"], "/v1/completions", json.dumps(
        {"prompt": "x", "allowed_token_ids": [1, 99999999]}).encode()), 400, "invalid_value")
    assert err["param"] == "allowed_token_ids"


def test_echo_scores_the_prompt_as_the_generation_does(server):
    """echo with max_tokens 0 scores a prompt: the prompt's tokens with their log
    probabilities (the first null), those of a greedy continuation within 1e-3 of what the
    generation reported for the same tokens, each of them its position's most likely token."""
    c, m = server["client"], server["model"]
    prompt = "The quick brown fox"
    status, body = _post(server["port"], "/tokenize", json.dumps({"prompt": prompt}).encode())
    assert status == 200
    ids = json.loads(body)["tokens"]
    gen = [int(x) for x in _reference_ids(prompt, 4).split(",")]
    r = c.completions.create(model=m, prompt=ids, max_tokens=4, temperature=0, logprobs=2,
                             extra_body={"ignore_eos": True})
    e = c.completions.create(model=m, prompt=ids + gen, max_tokens=0, echo=True, logprobs=2)
    ch, lp = e.choices[0], e.choices[0].logprobs
    assert ch.finish_reason == "length" and e.usage.completion_tokens == 0
    assert len(lp.tokens) == len(ids) + 4 == e.usage.prompt_tokens
    assert ch.text == "".join(lp.tokens) and ch.text.endswith(r.choices[0].text)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert lp.token_logprobs[-4:] == pytest.approx(r.choices[0].logprobs.token_logprobs, abs=1e-3)
    for tok, top in zip(lp.tokens[-4:], lp.top_logprobs[-4:]):
        assert len(top) == 2 and max(top, key=top.get) == tok
    # a text prompt comes back as written, the greedy continuation after it; streamed alike
    args = dict(model=m, prompt=prompt, max_tokens=5, temperature=0, echo=True,
                extra_body={"ignore_eos": True})
    whole = c.completions.create(**args)
    assert whole.choices[0].text == prompt + _reference(prompt, 5)
    chunks = [ch.choices[0].text for ch in c.completions.create(stream=True, **args)
              if ch.choices]
    assert chunks[0] == prompt and "".join(chunks) == whole.choices[0].text


def test_prompt_logprobs_as_vllm_gives_them(server):
    """vLLM's prompt_logprobs: per prompt token (the first None) a dict keyed by token id, the
    token first with the log probability echo gives it, its rank and text, then the best
    alternatives ranked 1..k as echo's alternatives; a token among them takes its place there.
    A chat's sit beside the choices, one per token of the rendered prompt."""
    c, m = server["client"], server["model"]
    status, body = _post(server["port"], "/tokenize",
                         json.dumps({"prompt": "The quick brown fox jumps"}).encode())
    assert status == 200
    ids = json.loads(body)["tokens"]
    r = c.completions.create(model=m, prompt=ids, max_tokens=1, temperature=0,
                             extra_body={"prompt_logprobs": 3})
    pl = r.choices[0].model_extra["prompt_logprobs"]
    e = c.completions.create(model=m, prompt=ids, max_tokens=0, echo=True, logprobs=3)
    lp = e.choices[0].logprobs
    assert pl[0] is None and len(pl) == len(ids)
    for i in range(1, len(ids)):
        entries = list(pl[i].items())
        key, own = entries[0]
        assert key == str(ids[i]) and own["decoded_token"] == lp.tokens[i]
        assert own["logprob"] == lp.token_logprobs[i]
        # the token among the best three keeps its place with its rank there
        alts = entries if len(entries) == 3 else entries[1:]
        assert sorted(a[1]["rank"] for a in alts) == [1, 2, 3]
        by_rank = sorted(alts, key=lambda kv: kv[1]["rank"])
        assert [a[1]["logprob"] for a in by_rank] == sorted((a[1]["logprob"] for a in alts),
                                                            reverse=True)
        # echo's alternatives are keyed by text (tokens of one text share a key)
        assert {a[1]["decoded_token"]: a[1]["logprob"] for a in by_rank} == lp.top_logprobs[i]
        if len(entries) == 4:  # ranked behind them (at most tied with the third)
            assert own["rank"] >= 3 and own["logprob"] <= by_rank[-1][1]["logprob"]
    ch = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "Hi"}],
                                   max_tokens=1, extra_body={"prompt_logprobs": 0})
    cpl = ch.model_extra["prompt_logprobs"]
    assert cpl[0] is None and len(cpl) == ch.usage.prompt_tokens
    assert all(len(d) == 1 and next(iter(d.values()))["rank"] >= 1 for d in cpl[1:])
    err = _error(*_post(server["port"], "/v1/completions", json.dumps(
        {"prompt": "x", "prompt_logprobs": 1, "stream": True}).encode()), 400, "invalid_value")
    assert err["param"] == "prompt_logprobs"


def test_tools_are_rendered_and_answered(server):
    """The random model does not call tools on its own; the call parsing is pinned by
    test_gateway_http. Here a request with tools must go through the template and the
    pipeline, and a required call must come back as a valid call of a declared function."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC"]}},
            "required": ["zone"]}}}]
    r = server["client"].chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools, max_tokens=8, temperature=0, extra_body=NO_THINK)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # a required call: the answer opens with the model's <tool_call> and verifyd lets through
    # only a call of a declared function with arguments its schema accepts (the random model
    # writes on after it: one call asked for); the stream agrees
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        args = dict(model=server["model"], tools=tools, tool_choice=choice, max_tokens=180,
                    temperature=0, extra_body=NO_THINK, parallel_tool_calls=False,
                    messages=[{"role": "user", "content": "Weather in Paris?"}])
        r = server["client"].chat.completions.create(**args)
        m = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", m
        call = m.tool_calls[0].function
        got = json.loads(call.arguments)
        if choice == "required" and call.name == "get_time":
            assert got == {"zone": "UTC"}
        else:
            assert call.name == "get_weather" and got["city"] in ("Paris", "Rome")
            assert set(got) <= {"city", "days"} and 1 <= got.get("days", 1) <= 7
        # streamed: the call's name first, then its arguments as they are written, joined by
        # index they are the whole answer's exactly
        calls = {}
        pieces = 0
        for c in server["client"].chat.completions.create(stream=True, **args):
            for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
                name, text = calls.get(d.index, (None, ""))
                calls[d.index] = (name or d.function.name, text + (d.function.arguments or ""))
                pieces += 1
        assert calls == {0: (call.name, call.arguments)}
        assert pieces > 2, pieces  # not whole at once
    # allowed_tools: only those shown; "required" makes one of them the answer's call
    r = server["client"].chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": "Time?"}], tools=tools,
        max_tokens=120, temperature=0, extra_body=NO_THINK, parallel_tool_calls=False,
        tool_choice={"type": "allowed_tools", "allowed_tools": {
            "mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]}})
    call = r.choices[0].message.tool_calls[0].function
    assert r.choices[0].finish_reason == "tool_calls"
    assert (call.name, json.loads(call.arguments)) == ("get_time", {"zone": "UTC"})
    # tool_choice "auto": the model (pushed to open calls by a bias on <tool_call>) writes
    # only calls of declared functions with valid arguments
    status, body = _post(server["port"], "/tokenize", json.dumps({"content": "<tool_call>"})
                         .encode())
    opener = json.loads(body)["tokens"]
    assert status == 200 and len(opener) == 1
    r = server["client"].chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=tools, max_tokens=160, temperature=0, logit_bias={str(opener[0]): 100},
        extra_body=NO_THINK)
    calls = r.choices[0].message.tool_calls or []
    assert calls
    for c in calls:
        got = json.loads(c.function.arguments)
        if c.function.name == "get_time":
            assert got == {"zone": "UTC"}, calls
        else:
            assert c.function.name == "get_weather" and got["city"] in ("Paris", "Rome"), calls


# --- the Responses API ---------------------------------------------------------------------------


def _events(server, body):
    """The typed events of a streamed /v1/responses request, as the openai client reads them."""
    return [e for e in server["client"].responses.create(stream=True, **body)]


def test_a_response_is_the_chat_answer_it_stands_for(server):
    """/v1/responses runs the chat request its input, instructions and settings make: the
    same greedy text, usage and finish, whole and streamed."""
    c, m = server["client"], server["model"]
    chat = c.chat.completions.create(
        model=m, messages=[{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Tell me a story."},
                           {"role": "assistant", "content": "Once"},
                           {"role": "user", "content": "Go on."}],
        max_tokens=20, temperature=0, extra_body=dict(NO_THINK, ignore_eos=True))
    body = dict(model=m, instructions="Be brief.", max_output_tokens=20, temperature=0,
                reasoning={"effort": "none"}, extra_body={"ignore_eos": True},
                input=[{"role": "user", "content": "Tell me a story."},
                       {"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": "Once"}]},
                       {"role": "user", "content": [{"type": "input_text", "text": "Go on."}]}])
    r = c.responses.create(**body)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"]
    assert r.output[0].role == "assistant" and r.output[0].status == "incomplete"
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.output_tokens == 20 == chat.usage.completion_tokens
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + 20
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == "Be brief." and r.max_output_tokens == 20 and r.store is True
    # streamed: numbered events, deltas adding up to the text, the whole response at the end
    ev = _events(server, body)
    assert [e.sequence_number for e in ev] == list(range(len(ev)))
    assert [e.type for e in ev[:4]] == ["response.created", "response.in_progress",
                                        "response.output_item.added",
                                        "response.content_part.added"]
    assert [e.type for e in ev[-4:]] == ["response.output_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done", "response.incomplete"]
    deltas = [e for e in ev if e.type == "response.output_text.delta"]
    text = "".join(e.delta for e in deltas)
    assert text == r.output_text and ev[-4].text == text
    assert {e.item_id for e in deltas} == {ev[2].item.id}
    final = ev[-1].response
    assert final.id == ev[0].response.id and final.output_text == text
    assert final.usage.output_tokens == 20
    # a string input is one user message; effort none is enable_thinking false
    one = c.responses.create(model=m, input="Hello!", max_output_tokens=8, temperature=0,
                             reasoning={"effort": "none"}, extra_body={"ignore_eos": True})
    ref = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "Hello!"}],
                                    max_tokens=8, temperature=0,
                                    extra_body=dict(NO_THINK, ignore_eos=True))
    assert one.output_text == ref.choices[0].message.content


def test_a_responses_reasoning_item_holds_the_thinking(server):
    """Qwen3.5's template opens <think>: the random model's output is all reasoning, a
    reasoning item whose text is the chat's reasoning_content, every token counted as
    reasoning."""
    c, m = server["client"], server["model"]
    ref = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "Why?"}],
                                    max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True}).choices[0].message
    body = dict(model=m, input="Why?", max_output_tokens=12, temperature=0,
                extra_body={"ignore_eos": True})
    r = c.responses.create(**body)
    assert [o.type for o in r.output] == ["reasoning"]
    assert r.output[0].content[0].text == ref.model_extra["reasoning_content"]
    assert r.output_text == ""
    assert r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens == 12
    ev = _events(server, body)
    deltas = "".join(e.delta for e in ev if e.type == "response.reasoning_text.delta")
    assert deltas == r.output[0].content[0].text
    assert ev[-1].type == "response.incomplete"


def test_responses_tools_formats_and_logprobs(server):
    c, m = server["client"], server["model"]
    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {
                  "city": {"type": "string", "enum": ["Paris", "Rome"]}},
                  "required": ["city"]}}]
    chat_tools = [{"type": "function", "function": {k: v for k, v in tools[0].items()
                                                    if k != "type"}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    # a required call: a function_call item, the chat's call
    ref = c.chat.completions.create(model=m, messages=msgs, tools=chat_tools,
                                    tool_choice="required", parallel_tool_calls=False,
                                    max_tokens=120, temperature=0, extra_body=NO_THINK)
    want = ref.choices[0].message.tool_calls[0].function
    body = dict(model=m, input="Weather in Paris?", tools=tools, tool_choice="required",
                parallel_tool_calls=False, max_output_tokens=120, temperature=0,
                reasoning={"effort": "none"})
    r = c.responses.create(**body)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1, r.output
    assert (calls[0].name, json.loads(calls[0].arguments)) == (want.name,
                                                              json.loads(want.arguments))
    assert calls[0].call_id.startswith("call_") and calls[0].status == "completed"
    ev = _events(server, body)
    done = [e for e in ev if e.type == "response.function_call_arguments.done"]
    assert [(d.name, d.arguments) for d in done] == [(calls[0].name, calls[0].arguments)]
    deltas = [e.delta for e in ev if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == calls[0].arguments and len(deltas) > 1, deltas
    # the client's stream helper rebuilds the same response from the events
    with c.responses.stream(**body) as st:
        for _ in st:
            pass
        final = st.get_final_response()
    assert final.status == "completed"
    assert [(o.type, o.name, o.arguments) for o in final.output if o.type == "function_call"] \
        == [(o.type, o.name, o.arguments) for o in calls]
    # the call and its output sent back as items: the chat with the assistant's tool_calls
    # and the tool message
    follow = [{"role": "user", "content": "Weather in Paris?"},
              {"type": "function_call", "call_id": "call_1", "name": "get_weather",
               "arguments": "{\"city\": \"Paris\"}"},
              {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    r2 = c.responses.create(model=m, input=follow, tools=tools, max_output_tokens=10,
                            temperature=0, reasoning={"effort": "none"},
                            extra_body={"ignore_eos": True})
    ref2 = c.chat.completions.create(
        model=m, tools=chat_tools, max_tokens=10, temperature=0,
        extra_body=dict(NO_THINK, ignore_eos=True),
        messages=[msgs[0], {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])
    assert r2.output_text == (ref2.choices[0].message.content or "")
    # text.format json_schema: the chat's response_format answer
    ref3 = c.chat.completions.create(
        model=m, messages=[{"role": "user", "content": "Who are you?"}], max_tokens=64,
        temperature=0, extra_body=NO_THINK, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    r3 = c.responses.create(model=m, input="Who are you?", max_output_tokens=64,
                            temperature=0, reasoning={"effort": "none"},
                            text={"format": {"type": "json_schema", "name": "person",
                                             "schema": PERSON}})
    assert r3.output_text == ref3.choices[0].message.content
    assert r3.text.format.type == "json_schema"
    if r3.status == "completed":
        _check_person(json.loads(r3.output_text))
    # logprobs with include: the chat's tokens and alternatives
    ref4 = c.chat.completions.create(model=m, messages=msgs, max_tokens=6, temperature=0,
                                     logprobs=True, top_logprobs=2,
                                     extra_body=dict(NO_THINK, ignore_eos=True))
    r4 = c.responses.create(model=m, input="Weather in Paris?", max_output_tokens=6,
                            temperature=0, reasoning={"effort": "none"}, top_logprobs=2,
                            include=["message.output_text.logprobs"],
                            extra_body={"ignore_eos": True})
    got = r4.output[0].content[0].logprobs
    assert len(got) == 6
    assert [(t.token, round(t.logprob, 4)) for t in got] == [
        (t.token, round(t.logprob, 4)) for t in ref4.choices[0].logprobs.content]
    assert all(len(t.top_logprobs) == 2 for t in got)


def test_responses_refuse_what_they_cannot_do(server):
    p = server["port"]
    for body, code, param in (
            ({"input": "x", "conversation": "conv_1"}, "unsupported_parameter",
             "conversation"),
            ({"input": "x", "background": True, "store": False}, "invalid_value",
             "background"),
            ({"input": [{"type": "input_image"}]}, "invalid_value", "input[0]"),
            ({"input": "x", "tools": [{"type": "web_search"}]}, "invalid_value", "tools[0]"),
            ({"input": [{"role": "user", "content": [{"type": "input_image",
                                                     "image_url": "x"}]}]}, "invalid_value",
             "input[0].content[0]"),
            ({"input": "x", "text": {"format": {"type": "xml"}}}, "invalid_value",
             "text.format.type"),
            ({}, "missing_required_parameter", "input"),
            ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
             "missing_required_parameter", "input[0].arguments")):
        err = _error(*_post(p, "/v1/responses", json.dumps(body).encode()), 400, code)
        assert err["param"] == param, err
    _error(*_post(p, "/v1/responses", json.dumps({"input": "x", "previous_response_id":
                                                  "resp_1"}).encode()), 404,
           "previous_response_not_found")
    # what the template or the context refuse names the input
    bad_args = [{"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "no json"}]
    err = _error(*_post(p, "/v1/responses", json.dumps({"input": bad_args}).encode()), 400,
                 "invalid_messages")
    assert err["param"] == "input", err
    err = _error(*_post(p, "/v1/responses", json.dumps({"input": "word " * 2000}).encode()),
                 400, "context_length_exceeded")
    assert err["param"] == "input" and "in the input" in err["message"], err
    _error(*_get(p, "/v1/responses/resp_123"), 404, "not_found")
    _healthy(server)


def test_a_kept_response_continues_and_can_be_fetched_and_deleted(server):
    """previous_response_id continues the kept conversation: the answer is the chat's with
    the whole history; a kept response comes back from GET and goes with DELETE."""
    c, m = server["client"], server["model"]
    args = dict(model=m, max_output_tokens=10, temperature=0, reasoning={"effort": "none"},
                extra_body={"ignore_eos": True})
    r1 = c.responses.create(input="Tell me a story.", instructions="Be brief.", **args)
    r2 = c.responses.create(input="Go on.", previous_response_id=r1.id, **args)
    assert r2.previous_response_id == r1.id and r2.instructions is None
    ref = c.chat.completions.create(
        model=m, max_tokens=10, temperature=0, extra_body=dict(NO_THINK, ignore_eos=True),
        messages=[{"role": "user", "content": "Tell me a story."},
                  {"role": "assistant", "content": r1.output_text},
                  {"role": "user", "content": "Go on."}])
    assert r2.output_text == ref.choices[0].message.content
    # the prompt counted without generating: what the response's usage says it was
    counted = c.responses.input_tokens.count(model=m, input="Go on.", previous_response_id=r1.id,
                                             reasoning={"effort": "none"})
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == r2.usage.input_tokens
    # the same turn with the first response's output items sent back as input, as agent loops
    # do: the same answer
    again = c.responses.create(input=[{"role": "user", "content": "Tell me a story."}]
                               + [o.model_dump() for o in r1.output]
                               + [{"role": "user", "content": "Go on."}], **args)
    assert again.output_text == r2.output_text
    # its input items, as the client's pager lists them two at a time, oldest first: the items
    # sent, the client's ids kept, new ones given
    items = list(c.responses.input_items.list(again.id, limit=2, order="asc"))
    assert [i.type for i in items] == ["message"] + [o.type for o in r1.output] + ["message"]
    assert items[0].content[0].text == "Tell me a story." and items[0].role == "user"
    assert items[-1].content[0].text == "Go on." and items[-1].status == "completed"
    assert items[1].id == r1.output[0].id and items[1].content[0].text == r1.output_text
    assert len({i.id for i in items}) == len(items)
    newest = c.responses.input_items.list(again.id, limit=1)
    assert [i.id for i in newest.data] == [items[-1].id] and newest.has_more
    # and a third turn, streamed, on top of the second
    ev = _events(server, dict(input="More.", previous_response_id=r2.id, **args))
    ref3 = c.chat.completions.create(
        model=m, max_tokens=10, temperature=0, extra_body=dict(NO_THINK, ignore_eos=True),
        messages=[{"role": "user", "content": "Tell me a story."},
                  {"role": "assistant", "content": r1.output_text},
                  {"role": "user", "content": "Go on."},
                  {"role": "assistant", "content": r2.output_text},
                  {"role": "user", "content": "More."}])
    assert ev[-1].response.output_text == ref3.choices[0].message.content
    got = c.responses.retrieve(r1.id)
    assert got.id == r1.id and got.output_text == r1.output_text
    assert got.usage.output_tokens == 10
    c.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r1.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(input="x", previous_response_id=r1.id, **args)
    # store false: nothing kept
    r4 = c.responses.create(input="Hi.", store=False, **args)
    assert r4.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r4.id)


def _settled(c, rid, timeout=60):
    """A background response polled until it leaves queued / in_progress."""
    deadline = time.time() + timeout
    while True:
        r = c.responses.retrieve(rid)
        if r.status not in ("queued", "in_progress"):
            return r
        assert time.time() < deadline, r
        time.sleep(0.05)


def test_a_background_response_runs_on_and_is_polled_streamed_and_resumed(server):
    """background: the request is answered at once (queued), the response runs on and ends as
    the foreground one does; streamed, its events can be read again from any sequence number."""
    c, m = server["client"], server["model"]
    args = dict(model=m, input="Tell me a story.", max_output_tokens=24, temperature=0,
                reasoning={"effort": "none"}, extra_body={"ignore_eos": True})
    fg = c.responses.create(**args)
    bg = c.responses.create(background=True, **args)
    assert bg.background is True and bg.status in ("queued", "in_progress")
    assert bg.output == [] and bg.usage is None
    done = _settled(c, bg.id)
    assert done.status == "incomplete" and done.background is True
    assert done.output_text == fg.output_text and done.usage.output_tokens == 24
    assert done.usage.input_tokens == fg.usage.input_tokens
    # streamed: created and queued first, then the foreground stream's events
    ev = _events(server, dict(background=True, **args))
    rid = ev[0].response.id
    assert [e.type for e in ev[:3]] == ["response.created", "response.queued",
                                        "response.in_progress"]
    assert ev[0].response.status == "queued" and ev[0].response.background is True
    assert [e.sequence_number for e in ev] == list(range(len(ev)))
    assert ev[-1].type == "response.incomplete" and ev[-1].response.output_text == fg.output_text
    fg_ev = _events(server, args)
    assert [e.type for e in ev[3:]] == [e.type for e in fg_ev[2:]]
    # read again from the start and from the middle: the same events
    again = list(c.responses.retrieve(rid, stream=True))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in ev]
    k = len(ev) // 2
    tail = list(c.responses.retrieve(rid, stream=True, starting_after=k))
    assert [e.sequence_number for e in tail] == list(range(k + 1, len(ev)))
    assert [e.model_dump() for e in tail] == [e.model_dump() for e in ev[k + 1:]]
    assert list(c.responses.retrieve(rid, stream=True, starting_after=len(ev) + 5)) == []
    assert c.responses.retrieve(rid).output_text == fg.output_text
    # a response made in the foreground has no events kept
    with pytest.raises(openai.BadRequestError):
        list(c.responses.retrieve(fg.id, stream=True))
    _error(*_get(server["port"], f"/v1/responses/{rid}?starting_after=x"), 400, "invalid_value")
    _error(*_get(server["port"], "/v1/responses/resp_none?stream=true"), 404, "not_found")


def test_a_background_response_can_be_cancelled_and_deleted(server):
    """cancel stops a running background response (its output so far kept, status cancelled,
    twice the same); a response that ended or never ran in the background cannot be cancelled;
    DELETE stops and forgets one."""
    c, m, p = server["client"], server["model"], server["port"]
    long = dict(model=m, input="Tell me a long story.", max_output_tokens=900, temperature=0,
                reasoning={"effort": "none"}, extra_body={"ignore_eos": True})
    bg = c.responses.create(background=True, **long)
    got = c.responses.cancel(bg.id)
    assert got.id == bg.id and got.status == "cancelled" and got.background is True
    assert got.usage is None or got.usage.output_tokens < 900
    assert c.responses.retrieve(bg.id).status == "cancelled"
    assert c.responses.cancel(bg.id).status == "cancelled"
    short = dict(long, max_output_tokens=4)
    ended = c.responses.create(background=True, **short)
    assert _settled(c, ended.id).status == "incomplete"
    err = _error(*_post(p, f"/v1/responses/{ended.id}/cancel", b""), 400, "invalid_request")
    assert "incomplete" in err["message"], err
    fg = c.responses.create(**short)
    err = _error(*_post(p, f"/v1/responses/{fg.id}/cancel", b""), 400, "invalid_request")
    assert "background" in err["message"], err
    _error(*_post(p, "/v1/responses/resp_none/cancel", b""), 404, "not_found")
    gone = c.responses.create(background=True, **long)
    c.responses.delete(gone.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(gone.id)
    time.sleep(0.5)  # its thread ends it; it must not come back
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(gone.id)
    _healthy(server)


# --- errors ---------------------------------------------------------------------------------------


def _error(status, body, want_status, want_code=None):
    assert status == want_status, body
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if want_code:
        assert err["code"] == want_code, err
    return err


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server):
    p = server["port"]
    chat = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    _error(*_post(p, chat, b'{"messages": [}'), 400, "invalid_json")
    _error(*_post(p, chat, json.dumps({"messages": msgs, "max_tokens": "ten"}).encode()), 400,
           "invalid_type")
    _error(*_post(p, chat, json.dumps({"messages": "hi"}).encode()), 400, "invalid_type")
    _error(*_post(p, chat, json.dumps({"messages": []}).encode()), 400, "empty_array")
    _error(*_post(p, chat, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'), 400,
           "invalid_json")
    _error(*_post(p, chat, b"x" * (2 << 20)), 413, "request_too_large")
    err = _error(*_post(p, chat, json.dumps({"messages": [{"role": "user",
                                                            "content": "word " * 1200}]}).encode()),
                 400, "context_length_exceeded")
    assert f"maximum context length is {CTX} tokens" in err["message"]
    _error(*_post(p, chat, json.dumps({"model": "nope", "messages": msgs}).encode()), 400,
           "model_not_found")
    _error(*_post(p, chat, json.dumps({"messages": msgs, "n": 129}).encode()), 400, "invalid_value")
    err = _error(*_post(p, chat, json.dumps({"messages": msgs,
                                              "logit_bias": {"99999999": 1}}).encode()), 400,
                 "invalid_value")
    assert err["param"] == "logit_bias" and "outside the vocabulary" in err["message"]
    _error(*_post(p, chat, json.dumps({"messages": msgs, "logit_bias": {"5": 101}}).encode()),
           400, "invalid_value")
    _error(*_post(p, chat, json.dumps({"messages": msgs, "frequency_penalty": -3}).encode()),
           400, "invalid_value")
    err = _error(*_post(p, chat, json.dumps({"messages": msgs, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "number", "multipleOf": 3}}}}).encode()), 400, "unsupported_value")
    assert "multipleOf" in err["message"]
    _error(*_post(p, chat, json.dumps({"messages": msgs, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "objekt"}}}}).encode()), 400, "invalid_value")
    _error(*_get(p, "/v1/nothing"), 404, "not_found")
    status, body = _post(p, chat, json.dumps({"messages": msgs, "max_tokens": 2,
                                             "some_new_field": {"x": 1}}).encode())
    assert status == 200, body
    with pytest.raises(openai.BadRequestError):
        server["client"].chat.completions.create(model=server["model"], messages=[])
    _healthy(server)


def test_client_disconnect_cancels_and_the_server_keeps_serving(server):
    p = server["port"]
    s = socket.create_connection(("127.0.0.1", p))
    body = json.dumps({"prompt": "a", "max_tokens": 400, "stream": True, "temperature": 0,
                       "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"data: " not in got:
        part = s.recv(4096)
        assert part, got
        got += part
    s.close()
    deadline = time.time() + 10
    while True:
        metrics = _get(p, "/metrics")[1].decode()
        line = [x for x in metrics.splitlines()
                if x.startswith("tandem_generations_cancelled_total ")]
        if line and int(line[0].split()[1]) >= 1:
            break
        assert time.time() < deadline, "the disconnect was not noticed"
        time.sleep(0.1)
    _healthy(server)


# --- load -------------------------------------------------------------------------------------------


def test_sixteen_concurrent_streams_match_their_solo_answers(server):
    c, m = server["client"], server["model"]
    prompts = [f"Story number {i}: once upon a time" for i in range(16)]

    def stream(prompt):
        chunks = c.chat.completions.create(
            model=m, messages=[{"role": "user", "content": prompt}], max_tokens=16,
            temperature=0, stream=True, extra_body=dict(NO_THINK, ignore_eos=True))
        return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)

    solo = [stream(p) for p in prompts]
    results = [None] * 16
    errors = []

    def worker(i):
        try:
            results[i] = stream(prompts[i])
        except Exception as e:  # collected and reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert results == solo


def test_metrics_report_requests_and_acceptance(server):
    text = _get(server["port"], "/metrics")[1].decode()
    assert 'tandem_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    assert "tandem_acceptance_length_bucket{le=\"+Inf\"}" in text
    assert "tandem_verifyd_ready 1" in text
    assert 'tandem_requests_total{endpoint="/v1/responses",status="200"}' in text
    kept = re.search(r"^tandem_responses_kept (\d+)$", text, re.M)
    size = re.search(r"^tandem_responses_kept_bytes (\d+)$", text, re.M)
    assert kept and int(kept.group(1)) > 0 and int(size.group(1)) > 500 * int(kept.group(1))
