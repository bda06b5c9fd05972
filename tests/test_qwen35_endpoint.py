"""benchmarks/qwen35_397b_grpo/endpoint.py: the chat-completions endpoint on the smoke config's tiny model, served
in a thread on an ephemeral 127.0.0.1 port and asked through urllib (no network beyond the loopback): an answer
carries token ids and log-probabilities equal to the generator's own for the same seed and settings (greedy ones
equal to a full forward's log-softmax), max_tokens and stop ids cut it where they should, concurrent requests get
what they would alone, bad requests answer 400 with one JSON line naming the field (an engine fault: 500, one
line), and a non-local host is refused in one line. The engine runs traced without XLA here (its XLA form:
tests/test_qwen35_generate.py)."""
from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import REPO
from tests.helpers import decoder_golden

CONFIG = os.path.join(REPO, "configs", "qwen35_397b_grpo", "smoke.yaml")
PROMPT_TOKENS, MAX_TOKENS = 8, 6


@pytest.fixture(scope="module")
def served():
    from benchmarks.qwen35_397b_grpo.endpoint import Endpoint

    workload = decoder_golden.build_workload(CONFIG, [])
    # One trace, no XLA: the engine's XLA compile costs about 20 s of CPU here and is tested by
    # test_qwen35_generate.py; what this file tests (the HTTP side) is the same either way.
    endpoint = Endpoint(workload.model, PROMPT_TOKENS, MAX_TOKENS, jit_compile=False)
    server = endpoint.server(0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield workload, endpoint, f"http://{host}:{port}/v1/chat/completions"
    server.shutdown()
    server.server_close()
    thread.join()


def post(url: str, body: object) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def chat(url: str, prompt: list[int], **settings) -> dict:
    # the prompt split over two messages, one as a list of ints and one as a string of ids: concatenated in order
    body = {"model": "toy", "messages": [{"role": "system", "content": prompt[:2]},
                                         {"role": "user", "content": " ".join(map(str, prompt[2:]))}],
            "logprobs": True, **settings}
    status, text = post(url, body)
    assert status == 200, text
    return json.loads(text)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_answers_with_the_generators_token_ids_and_log_probs(served):
    import tensorflow as tf

    from benchmarks.qwen35_397b_grpo.generate import SamplingParams

    workload, endpoint, url = served
    prompt = workload.env.reset(int(workload.env.eval_ids[0]))
    for temperature, top_p, seed in ((0.7, 0.9, 5), (0.0, 1.0, 0)):
        out = chat(url, prompt, temperature=temperature, top_p=top_p, seed=seed, max_tokens=MAX_TOKENS)
        choice = out["choices"][0]
        ids, message = choice["token_ids"], choice["message"]
        lps = [c["logprob"] for c in choice["logprobs"]["content"]]
        assert out["object"] == "chat.completion" and out["model"] == "toy" and choice["finish_reason"] == "length"
        assert len(ids) == MAX_TOKENS and message["role"] == "assistant"
        assert message["content"] == " ".join(map(str, ids)) and message["generation_token_ids"] == ids
        assert message["prompt_token_ids"] == out["prompt_token_ids"] == prompt
        assert message["generation_log_probs"] == lps
        assert [c["token"] for c in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in ids]
        assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": MAX_TOKENS, "total_tokens": 5 + MAX_TOKENS}
        # the generator's own numbers for the same prompt, settings and seed (float32 through JSON: exact)
        ref = endpoint.generator.generate([prompt], SamplingParams(temperature, top_p), seed)
        assert ids == ref.tokens[0, 5:5 + MAX_TOKENS].tolist()
        assert lps == [float(x) for x in ref.logprobs[0, 5:5 + MAX_TOKENS]]
        assert all(np.isfinite(lps)) and max(lps) <= 0.0
    # greedy: each token is the argmax of a full forward of the row so far, its log-prob that forward's log-softmax
    row = prompt + ids
    hidden, _ = workload.model(tf.constant([row], tf.int32))
    full = log_softmax(workload.model.logits(hidden).numpy()[0])[len(prompt) - 1:-1]
    assert ids == full.argmax(-1).tolist()
    np.testing.assert_allclose(lps, full[np.arange(MAX_TOKENS), ids], atol=1e-4)
    assert chat(url, prompt, temperature=0.7, top_p=0.9, seed=6)["choices"][0]["token_ids"] != \
        chat(url, prompt, temperature=0.7, top_p=0.9, seed=5)["choices"][0]["token_ids"]   # the seed counts


def test_max_tokens_stop_ids_and_concurrent_requests(served):
    workload, _, url = served
    prompt = workload.env.reset(int(workload.env.eval_ids[1]))
    full = chat(url, prompt, temperature=1.0, seed=11)["choices"][0]
    short = chat(url, prompt, temperature=1.0, seed=11, max_tokens=3)["choices"][0]
    assert short["token_ids"] == full["token_ids"][:3] and short["finish_reason"] == "length"
    assert short["message"]["generation_log_probs"] == full["message"]["generation_log_probs"][:3]
    stop = full["token_ids"][2]
    first = full["token_ids"].index(stop)
    stopped = chat(url, prompt, temperature=1.0, seed=11, stop_token_ids=[stop])["choices"][0]
    assert stopped["token_ids"] == full["token_ids"][:first + 1] and stopped["finish_reason"] == "stop"
    # four requests at once (the server's threads; the engine one at a time): each what it is alone
    answers: dict[int, dict] = {}
    threads = [threading.Thread(target=lambda s=s: answers.__setitem__(s, chat(url, prompt, seed=s)))
               for s in (11, 12, 11, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers[11]["choices"][0]["token_ids"] == full["token_ids"] and len(answers) == 3


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    ({"max_tokens": 2}, "messages"),
    ({"messages": [{"role": "user", "content": "hello there"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "1 2"}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [1, 2]}, {"content": [3]}]}, "messages[1]"),
    ({"messages": [{"role": "user", "content": list(range(3, 3 + PROMPT_TOKENS + 1))}]}, "messages"),
    ({"messages": [{"role": "user", "content": [1, 32]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [1, 2]}], "max_tokens": MAX_TOKENS + 1}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [1, 2]}], "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "user", "content": [1, 2]}], "top_p": 0}, "top_p"),
    ({"messages": [{"role": "user", "content": [1, 2]}], "seed": -1}, "seed"),
    ({"messages": [{"role": "user", "content": [1, 2]}], "n": 2}, "n"),
])
def test_a_bad_request_is_a_400_with_one_error_line(served, body, param):
    _, _, url = served
    status, text = post(url, body)
    assert status == 400 and text.count("\n") == 1 and text.endswith("\n"), text
    error = json.loads(text)["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"], error
    assert "Traceback" not in text


def test_only_localhost_is_served(served, capsys):
    from harness.errors import HarnessError

    from benchmarks.qwen35_397b_grpo.endpoint import main

    _, endpoint, url = served
    with pytest.raises(HarnessError, match="127.0.0.1 only"):
        endpoint.server(0, host="0.0.0.0")
    assert main(["--config", CONFIG, "--host", "0.0.0.0"]) == 2     # refused before anything is built
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "127.0.0.1 only" in err
    status, text = post(url.replace("/v1/chat/completions", "/v1/completions"), {"prompt": [1]})
    assert status == 404 and json.loads(text)["error"]["message"]


def test_an_engine_fault_is_a_500_with_one_error_line(served, monkeypatch):
    _, endpoint, url = served

    def broken(*args, **kwargs):
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(endpoint.generator, "generate", broken)
    status, text = post(url, {"messages": [{"role": "user", "content": [1, 2]}]})
    assert status == 500 and text.count("\n") == 1 and "Traceback" not in text, text
    assert json.loads(text)["error"] == {"message": "generation failed: RuntimeError: the engine broke",
                                         "type": "server_error", "param": None}
    monkeypatch.undo()
    assert post(url, {"messages": [{"role": "user", "content": [1, 2]}], "max_tokens": 1})[0] == 200
