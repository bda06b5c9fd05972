"""The generator's agent-facing side: a localhost HTTP endpoint in the OpenAI chat-completions format that answers
with token ids and per-token log-probabilities, so an external agent (the reference's OpenHands, through NeMo
Gym) can drive rollouts against the policy's current weights.

POST /v1/chat/completions takes `messages` whose `content` is TOKEN IDS, a list of ints or a string of
space-separated ints: the toy model has no text tokenizer and no chat template, so the prompt is the messages'
tokens concatenated in order (the agent writes any role markers itself; a multi-turn history only ever
appends, as environment.py keeps it). Any other content is refused with a 400 naming the field. Settings:
`max_tokens` (default and cap: the server's), `temperature` (default 1), `top_p` (default 1), `seed` (default 0),
`logprobs`, `stop_token_ids` (vLLM's extra field; default the server's), `n` 1 only.

The answer is OpenAI's chat.completion (`choices[0].message`, `finish_reason` "stop" on a stop token, kept as
the last token, else "length"; `usage`) with the token ids where the reference's agent side reads them: the
choice's `token_ids` and the answer's `prompt_token_ids` (vLLM's return_token_ids), the message's
`prompt_token_ids`, `generation_token_ids` and `generation_log_probs` (NVIDIA-NeMo/Gym's token fields for
training) and, when `logprobs` is true, `logprobs.content[i]` = {"token": "token_id:N", "logprob": ...} (vLLM's
return_tokens_as_token_ids form). The message's `content` is the generated ids as a space-separated string, so it
can be sent back as the next turn.

The numbers are `generate.Generator`'s: one slot, the prompt left-padded to the server's prompt cap, one XLA
compile of prefill and decode reused by every request (sampling settings are inputs); the log-probability is
the generator's lp_gen (after temperature and top-p; greedy: the raw log-softmax). Requests are served one at a
time under `Endpoint.lock` (a trainer in the same process may hold it while it updates the weights, which the
next request reads). The engine runs to its cap unless a stop token ends the slot, and `max_tokens` cuts the
answer: a token's draw depends only on the tokens before it and its own seed, so the cut is exact.

Bound to 127.0.0.1 only: no authentication, a local agent only; any other host is refused in one line.
Bad requests (malformed JSON, missing or mistyped fields, a prompt over the cap, ids outside the vocabulary)
answer 400 with one JSON line {"error": {"message", "type", "param"}}, never a traceback.

    python -m benchmarks.qwen35_397b_grpo.endpoint --config configs/qwen35_397b_grpo/smoke.yaml --port 8000
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from absl import logging

from harness.errors import HarnessError

from benchmarks.qwen35_397b_grpo import generate

HOST = "127.0.0.1"
PATH = "/v1/chat/completions"
MAX_BODY = 1 << 20  # bytes of one request body
SEED_LIMIT = 1 << 32  # generate.row_seeds: seeds count through their low 32 bits under XLA


def check_host(host: str) -> None:
    """Refuses any host but this machine's loopback in one line: the endpoint has no authentication."""
    if host not in (HOST, "localhost"):
        raise HarnessError(f"the chat endpoint binds {HOST} only (no authentication: a local agent), got host "
                           f"{host!r}")


class RequestError(ValueError):
    """A request the endpoint refuses: a 400 naming the field (`param`)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object; one line once serialised."""
    return {"error": {"message": " ".join(message.split()), "type": kind, "param": param}}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name, default)
    if value is None:
        value = default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise RequestError(name, f"'{name}' must be a number, got {value!r}")
    if value < low or value > high or (low_open and value == low):
        raise RequestError(name, f"'{name}' must be in {'(' if low_open else '['}{low}, {high}], got {value}")
    return float(value)


def _integer(body: dict, name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if value is None:
        value = default
    if not _is_int(value) or not low <= value <= high:
        raise RequestError(name, f"'{name}' must be an integer in [{low}, {high}], got {value!r}")
    return value


def token_ids(content: Any, field: str, vocab: int) -> list[int]:
    """Token ids of one message's content: a list of ints or a string of space-separated ints, each in
    [0, vocab)."""
    if isinstance(content, str):
        try:
            ids = [int(t) for t in content.split()]
        except ValueError:
            raise RequestError(field, f"'{field}' must be token ids (a list of ints or a string of space-separated "
                                      f"ints): this model has no text tokenizer") from None
    elif isinstance(content, list) and all(_is_int(t) for t in content):
        ids = list(content)
    else:
        raise RequestError(field, f"'{field}' must be token ids (a list of ints or a string of space-separated "
                                  f"ints): this model has no text tokenizer")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise RequestError(field, f"'{field}' has ids outside the vocabulary [0, {vocab}): {bad[:5]}")
    return ids


class Endpoint:
    """Chat completions over one `generate.Generator` slot of `model`: prompts of at most `prompt_tokens`
    tokens, at most `max_tokens` generated, `stop_ids` ending a completion unless a request names its own."""

    def __init__(self, model: Any, prompt_tokens: int, max_tokens: int, stop_ids: tuple[int, ...] = (),
                 jit_compile: bool = True, name: str = "qwen35_397b_grpo") -> None:
        self.generator = generate.Generator(model, 1, prompt_tokens, max_tokens, stop_ids, jit_compile=jit_compile)
        self.vocab = int(model.cfg.vocab_size)
        self.name = name
        self.lock = threading.Lock()
        self._ids = itertools.count(1)

    def parse(self, body: Any) -> dict[str, Any]:
        """The generation settings of a decoded request body, or a RequestError naming the bad field."""
        g = self.generator
        if not isinstance(body, dict):
            raise RequestError(None, "the request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages", "'messages' must be a non-empty list of {role, content} objects")
        prompt: list[int] = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise RequestError(f"messages[{i}]", f"'messages[{i}]' must be an object with 'role' (a string) "
                                                     f"and 'content'")
            prompt += token_ids(m["content"], f"messages[{i}].content", self.vocab)
        if not 1 <= len(prompt) <= g.prompt_length:
            raise RequestError("messages", f"the prompt has {len(prompt)} tokens; this endpoint takes 1 to "
                                           f"{g.prompt_length}")
        _integer(body, "n", 1, 1, 1)  # one completion per request
        if body.get("top_logprobs"):
            raise RequestError("top_logprobs", "'top_logprobs' is not supported (only the sampled token's)")
        if body.get("stream"):
            raise RequestError("stream", "'stream' is not supported")
        logprobs = body.get("logprobs", False)
        if not isinstance(logprobs, bool) and logprobs is not None:
            raise RequestError("logprobs", f"'logprobs' must be true or false, got {logprobs!r}")
        stops = body.get("stop_token_ids")
        if stops is None:
            stops = g.stop_ids
        elif not isinstance(stops, list) or not all(_is_int(t) and 0 <= t < self.vocab for t in stops):
            raise RequestError("stop_token_ids", f"'stop_token_ids' must be a list of ids in [0, {self.vocab})")
        model = body.get("model", self.name)
        return {"prompt": prompt, "max_tokens": _integer(body, "max_tokens", g.max_new_tokens, 1, g.max_new_tokens),
                "sampling": generate.SamplingParams(_number(body, "temperature", 1.0, 0.0, 1e6),
                                                    _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)),
                "seed": _integer(body, "seed", 0, 0, SEED_LIMIT - 1), "logprobs": bool(logprobs),
                "stop_ids": tuple(stops), "model": model if isinstance(model, str) else self.name}

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """The chat.completion of parsed settings `request` (see `parse`), under the lock."""
        prompt, cap = request["prompt"], request["max_tokens"]
        with self.lock:
            out = self.generator.generate([prompt], request["sampling"], request["seed"],
                                          stop_ids=request["stop_ids"])
        p, end = len(prompt), int(out.lengths[0])
        new = [int(t) for t in out.tokens[0, p:end]][:cap]
        lps = [float(x) for x in out.logprobs[0, p:end]][:cap]
        stopped = bool(new) and new[-1] in request["stop_ids"]
        message = {"role": "assistant", "content": " ".join(str(t) for t in new), "prompt_token_ids": prompt,
                   "generation_token_ids": new, "generation_log_probs": lps}
        logprobs = ({"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                                 for t, lp in zip(new, lps)]} if request["logprobs"] else None)
        return {"id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": int(time.time()),
                "model": request["model"], "prompt_token_ids": prompt,
                "choices": [{"index": 0, "message": message, "logprobs": logprobs, "token_ids": new,
                             "finish_reason": "stop" if stopped else "length"}],
                "usage": {"prompt_tokens": p, "completion_tokens": len(new), "total_tokens": p + len(new)}}

    def answer(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) for a raw request body: 200 and the completion, 400 and a one-line error for
        a bad request, 500 for a failure of the engine (logged)."""
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return 400, error_body(f"the request body is not valid JSON: {e}")
        try:
            return 200, self.complete(self.parse(body))
        except RequestError as e:
            return 400, error_body(str(e), e.param)
        except Exception as e:  # noqa: BLE001 - an engine fault answers one line; the log keeps the traceback
            logging.exception("chat completion failed")
            return 500, error_body(f"generation failed: {type(e).__name__}: {e}", kind="server_error")

    def server(self, port: int = 0, host: str = HOST) -> ThreadingHTTPServer:
        """A server on host:port (port 0: an ephemeral one, `server.server_address` says which), not yet
        serving. Any host but 127.0.0.1 is refused."""
        check_host(host)
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = (json.dumps(body) + "\n").encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0].rstrip("/") != PATH:
                    self._send(404, error_body(f"no such path {self.path}; POST {PATH}"))
                    return
                try:
                    length = int(self.headers.get("Content-Length", ""))
                except ValueError:
                    self._send(411, error_body("a Content-Length header is required"))
                    return
                if not 0 <= length <= MAX_BODY:
                    self._send(413, error_body(f"the request body must be at most {MAX_BODY} bytes"))
                    return
                self._send(*endpoint.answer(self.rfile.read(length)))

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._send(405 if self.path.rstrip("/") == PATH else 404, error_body(f"POST {PATH}"))

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                logging.info("%s " + format, self.client_address[0], *args)

        return ThreadingHTTPServer((HOST, port), Handler)


def serve(workload: Any, port: int, host: str = HOST, prompt_tokens: int = 256, max_tokens: int = 64,
          stop_ids: tuple[int, ...] = ()) -> None:
    """Serves chat completions of a built workload's model (its current weights) on host:port until
    interrupted, after one line with the address (printed once the engine is compiled)."""
    jit = workload.cfg.runtime.jit_compile is not False
    endpoint = Endpoint(workload.model, prompt_tokens, max_tokens, stop_ids, jit_compile=jit, name=workload.NAME)
    server = endpoint.server(port, host)
    endpoint.generator.generate([[0]])  # compiles the engine before the address is out, not at the first request
    address = f"http://{server.server_address[0]}:{server.server_address[1]}{PATH}"
    print(f"qwen35_397b_grpo chat endpoint: POST {address} (token ids in, token ids and log-probs out)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.qwen35_397b_grpo.endpoint", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--config", required=True, help="a qwen35_397b_grpo config (its model and init_checkpoint)")
    parser.add_argument("--port", type=int, default=8000, help="0: an ephemeral port")
    parser.add_argument("--host", default=HOST, help=f"{HOST} only")
    parser.add_argument("--prompt_tokens", type=int, default=256, help="the longest prompt")
    parser.add_argument("--max_tokens", type=int, default=64, help="the most tokens one completion generates")
    parser.add_argument("--stop_ids", default="", help="comma-separated token ids that end a completion")
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                        help="a config override, as the harness's (e.g. model.init_checkpoint=DIR); repeatable")
    args = parser.parse_args(argv)
    try:
        check_host(args.host)
        if not 0 <= args.port < 65536 or args.prompt_tokens < 1 or args.max_tokens < 1:
            raise HarnessError("--port must be in [0, 65535], --prompt_tokens and --max_tokens >= 1")
        try:
            stops = tuple(int(t) for t in args.stop_ids.split(",") if t.strip())
        except ValueError:
            raise HarnessError(f"--stop_ids must be comma-separated ints, got {args.stop_ids!r}") from None
        from harness import config as config_lib
        from harness.runtime import make_runtime

        cfg = config_lib.load_config(args.config, args.overrides)
        if cfg.workload_class.NAME != "qwen35_397b_grpo":
            raise HarnessError(f"{args.config} is a {cfg.workload_class.NAME} config, not qwen35_397b_grpo")
        runtime = make_runtime(cfg.runtime, cfg.submission.platform)
        workload = cfg.workload_class(cfg, runtime)
        workload.validate()
        with runtime.scope():
            workload.build()
        serve(workload, args.port, args.host, args.prompt_tokens, args.max_tokens, stops)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # the port taken, say
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
