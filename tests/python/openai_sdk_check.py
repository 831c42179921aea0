"""The official OpenAI Python SDK against gateway-lite.

Run with the python of the virtualenv scripts/ensure-tools.sh makes
(openai-<version> under the Meterline cache); tests/tests/openai_sdk.rs
runs it against a gateway of its own. Settings, all required:

  SDK_CHECK_BASE_URL         the gateway's base URL, with /v1
  SDK_CHECK_KEY              a key with generous limits
  SDK_CHECK_LIMITED_KEY      a key with rpm 1, not used before
  SDK_CHECK_SIMULATED_MODEL  a model on the gateway's simulator
  SDK_CHECK_UPSTREAM_MODEL   a model served by an HTTP upstream

Each check prints one JSON line on stdout: its name, the key it used
(`main` or `limited`), the HTTP status and, for a 200, the usage the SDK
parsed, so the caller can sum the usage of every 200 and compare it with
what was billed. The first failure exits 1 with `FAIL <check>: <why>` on
stderr.
"""

import json
import math
import os
import sys

import openai

# A 1×1 transparent PNG.
PNG_1X1 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="
)
# engine::openai::IMAGE_PART_TOKENS: what an image part costs the simulator.
IMAGE_PART_TOKENS = 85


class Failed(Exception):
    pass


def setting(name):
    value = os.environ.get(name)
    if not value:
        sys.stderr.write(f"openai_sdk_check: {name} is not set\n")
        sys.exit(2)
    return value


BASE_URL = setting("SDK_CHECK_BASE_URL")
SIMULATED = setting("SDK_CHECK_SIMULATED_MODEL")
UPSTREAM = setting("SDK_CHECK_UPSTREAM_MODEL")
KEYS = {"main": setting("SDK_CHECK_KEY"), "limited": setting("SDK_CHECK_LIMITED_KEY")}


def client(key):
    return openai.OpenAI(base_url=BASE_URL, api_key=key, max_retries=0, timeout=60)


def ensure(cond, why):
    if not cond:
        raise Failed(why)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def usage_of(usage, where):
    """The usage as a dict, after checking its counts are integers that add up."""
    ensure(usage is not None, f"{where}: no usage")
    counts = {k: getattr(usage, k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    for k, v in counts.items():
        ensure(is_int(v) and v >= 0, f"{where}: usage.{k} is {v!r}, not a count")
    ensure(
        counts["total_tokens"] == counts["prompt_tokens"] + counts["completion_tokens"],
        f"{where}: total_tokens {counts['total_tokens']} != prompt + completion {counts}",
    )
    ensure(counts["completion_tokens"] > 0, f"{where}: no completion tokens")
    details = usage.prompt_tokens_details
    counts["cached_tokens"] = (details.cached_tokens if details else None) or 0
    ensure(is_int(counts["cached_tokens"]), f"{where}: cached_tokens {counts['cached_tokens']!r}")
    return counts


def report(check, key, status, **fields):
    print(json.dumps({"check": check, "key": key, "status": status, **fields}), flush=True)


def answered(check, key, completion, model):
    """Checks a non-streamed 200 and reports its usage."""
    ensure(completion.object == "chat.completion", f"object {completion.object!r}")
    ensure(completion.model == model, f"model {completion.model!r}, asked {model!r}")
    ensure(len(completion.choices) == 1, f"{len(completion.choices)} choices")
    choice = completion.choices[0]
    ensure(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    ensure(isinstance(choice.message.content, str), f"content {choice.message.content!r}")
    ensure(completion._request_id, "no x-request-id")
    report(check, key, 200, request_id=completion._request_id, usage=usage_of(completion.usage, check))


def user(text):
    return [{"role": "user", "content": text}]


def check_plain():
    model = SIMULATED
    done = client(KEYS["main"]).chat.completions.create(
        model=model, messages=user("say hello"), max_tokens=16, seed=1
    )
    answered("plain", "main", done, model)


def check_stream():
    model = SIMULATED
    stream = client(KEYS["main"]).chat.completions.create(
        model=model,
        messages=user("count to ten"),
        max_tokens=24,
        seed=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    ensure(len(chunks) >= 2, f"{len(chunks)} chunks")
    *body, last = chunks
    for i, c in enumerate(body):
        ensure(c.object == "chat.completion.chunk", f"chunk {i}: object {c.object!r}")
        ensure(c.usage is None, f"chunk {i} of {len(chunks)} carries usage")
        ensure(len(c.choices) == 1, f"chunk {i}: {len(c.choices)} choices")
    text = "".join(c.choices[0].delta.content or "" for c in body)
    ensure(text, "no content streamed")
    ensure(body[-1].choices[0].finish_reason in ("stop", "length"), "no finish_reason before usage")
    ensure(last.choices == [], f"the usage chunk has choices {last.choices!r}")
    usage = usage_of(last.usage, "stream")
    report("stream", "main", 200, request_id=stream.response.headers.get("x-request-id"), usage=usage)


def check_content_parts():
    model = SIMULATED
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in this picture?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_1X1}"}},
            ],
        }
    ]
    done = client(KEYS["main"]).chat.completions.create(model=model, messages=messages, max_tokens=8)
    ensure(
        done.usage is not None and done.usage.prompt_tokens > IMAGE_PART_TOKENS,
        f"the image part is not counted: {done.usage}",
    )
    answered("content_parts", "main", done, model)


def check_tools_upstream():
    model = UPSTREAM
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "14 C"},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    done = client(KEYS["main"]).chat.completions.create(
        model=model, messages=messages, tools=tools, max_tokens=8
    )
    answered("tools_upstream", "main", done, model)


# What the simulator refuses, and the `param` the gateway names
# (engine::openai::ChatRequest::unsupported_by_simulator).
REFUSED = [
    ("n", {"n": 2}),
    ("logprobs", {"logprobs": True}),
    ("top_logprobs", {"top_logprobs": 2}),
    ("tool_choice", {"tool_choice": "required"}),
    ("tool_choice", {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    (
        "response_format",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": {"type": "object"}},
            }
        },
    ),
    # Modalities are checked before audio settings.
    ("modalities", {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}),
    ("audio", {"audio": {"voice": "alloy", "format": "wav"}}),
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def check_refused():
    c = client(KEYS["main"])
    for param, extra in REFUSED:
        where = f"{param} {json.dumps(extra)}"
        if "tool_choice" in extra:
            extra = {**extra, "tools": TOOLS}
        try:
            c.chat.completions.create(model=SIMULATED, messages=user("hello"), max_tokens=4, **extra)
        except openai.BadRequestError as e:
            ensure(e.status_code == 400, f"{where}: status {e.status_code}")
            ensure(isinstance(e.body, dict), f"{where}: body {e.body!r}")
            ensure(e.body.get("param") == param, f"{where}: body param {e.body.get('param')!r}: {e.body}")
            ensure(e.param == param, f"{where}: e.param {e.param!r}")
            ensure(e.type == "invalid_request_error", f"{where}: type {e.type!r}")
            ensure(e.request_id, f"{where}: no x-request-id")
            report("refused", "main", 400, param=e.param)
        else:
            raise Failed(f"{where}: answered, expected BadRequestError naming {param!r}")


def check_wrong_key():
    try:
        client("sk-not-a-key-of-any-tenant").chat.completions.create(
            model=SIMULATED, messages=user("hello"), max_tokens=4
        )
    except openai.AuthenticationError as e:
        ensure(e.status_code == 401, f"status {e.status_code}")
        ensure(e.code == "invalid_api_key", f"code {e.code!r}: {e.body}")
        report("wrong_key", "none", 401, code=e.code)
    else:
        raise Failed("a wrong key was answered, expected AuthenticationError")


def check_rate_limited():
    model = SIMULATED
    c = client(KEYS["limited"])
    done = c.chat.completions.create(model=model, messages=user("first"), max_tokens=8)
    answered("rate_limited_first", "limited", done, model)
    try:
        c.chat.completions.create(model=model, messages=user("second"), max_tokens=8)
    except openai.RateLimitError as e:
        h = e.response.headers
        ensure(e.status_code == 429, f"status {e.status_code}")
        ensure(e.code == "rate_limit_exceeded", f"code {e.code!r}: {e.body}")
        for name in ("retry-after", "retry-after-ms"):
            ensure(name in h and h[name].isdigit(), f"{name} is {h.get(name)!r}")
        secs, ms = int(h["retry-after"]), int(h["retry-after-ms"])
        ensure(ms > 0, f"retry-after-ms {ms}")
        ensure(secs == max(1, math.ceil(ms / 1000)), f"retry-after {secs} != ceil({ms} / 1000)")
        ensure(h.get("x-ratelimit-limit-requests") == "1", f"x-ratelimit-limit-requests {h.get('x-ratelimit-limit-requests')!r}")
        ensure(h.get("x-ratelimit-remaining-requests") == "0", f"x-ratelimit-remaining-requests {h.get('x-ratelimit-remaining-requests')!r}")
        report("rate_limited", "limited", 429, retry_after=secs, retry_after_ms=ms)
    else:
        raise Failed("a second request within rpm 1 was answered, expected RateLimitError")


CHECKS = [
    check_plain,
    check_stream,
    check_content_parts,
    check_tools_upstream,
    check_refused,
    check_wrong_key,
    check_rate_limited,
]


def main():
    for check in CHECKS:
        name = check.__name__.removeprefix("check_")
        try:
            check()
        except Failed as e:
            sys.stderr.write(f"openai_sdk_check: FAIL {name}: {e}\n")
            sys.exit(1)
        except openai.APIStatusError as e:
            sys.stderr.write(
                f"openai_sdk_check: FAIL {name}: unexpected {type(e).__name__} {e.status_code}: {e.body}\n"
            )
            sys.exit(1)
        except Exception as e:  # the SDK refusing what the gateway sent
            sys.stderr.write(f"openai_sdk_check: FAIL {name}: {type(e).__name__}: {e}\n")
            sys.exit(1)
    sys.stderr.write(f"openai_sdk_check: {len(CHECKS)} checks passed (openai {openai.__version__})\n")


if __name__ == "__main__":
    main()
