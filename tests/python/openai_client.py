#!/usr/bin/env python3
"""`kiln serve` through the official `openai` Python client.

Usage:

    kiln serve --model DIR|PRESET --host 127.0.0.1 --port 0
    # wait for "kiln serve: listening on http://HOST:PORT", then
    python3 tests/python/openai_client.py http://HOST:PORT/v1 MODEL_ID

MODEL_ID is the id `GET /v1/models` lists: the preset name, or the model directory's last
path component. The served model must have a tokenizer and a chat template. Needs only the
standard library and `openai` (`pip install openai`).

Each check prints one line, `ok   NAME: detail` or `FAIL NAME: why`, and a final line counts
them; the exit status is 0 when every check passed, 1 otherwise (2 for bad arguments). A
check whose request fails is a failure, never a skip; one that needs another's result (the
streamed text against the non-streamed one) fails when that one failed. Every request has
a 60 second timeout and no retries, so the script does not hang on a server that stops
answering; once a request gets no answer at all (refused connection, timeout) the remaining
checks are not run and count as failed.

Checks, all greedy (`temperature=0`, so the streamed and the non-streamed answers must be
equal):
  models          `client.models.list()` contains MODEL_ID
  completion      one choice, `text` a str, finish_reason `length` or `stop`, usage with
                  prompt_tokens > 0, 1 <= completion_tokens <= max_tokens, total = sum
  completion-stream
                  `stream=True`: chunks of object `text_completion` whose texts, joined,
                  are the non-streamed text; the last chunk with a choice has its
                  finish_reason; no chunk has usage (not asked for)
  completion-usage
                  `stream_options={"include_usage": True}`: the last chunk has usage (equal
                  to the non-streamed usage) and no choices; the chunks before it have none
  chat, chat-stream, chat-usage
                  the same through `client.chat.completions.create` with one user message:
                  message.content (role `assistant`) against the joined `delta.content`
                  (the first delta may carry role `assistant` and no content)
  bad-max-tokens, bad-temperature
                  `max_tokens=0`, `temperature=-1` raise `openai.BadRequestError` (400)
                  with OpenAI's error body (`message` a str; `type`, `param`, `code`)
  token-prompt    `prompt=[1, 2, 3]` gives one choice and usage with prompt_tokens = 3
  token-ids, token-ids-stream
                  kiln's `return_token_ids` extension: each choice's `token_ids` is a list
                  of completion_tokens ints; streamed, the chunks' ids joined are the same
"""
import argparse
import sys
import traceback

try:
    import openai
    from openai import OpenAI
except ImportError:
    sys.exit("the openai package is needed: pip install openai")

MAX_TOKENS = 8
PROMPT = "the kiln fires clay and the potter shapes the"
CHAT = [{"role": "user", "content": "tell me what the kiln does with the clay"}]
FINISH = {"length", "stop"}


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.results = {}
        self.unreachable = None  # why the server stopped answering, once it has

    def run(self, name, function, *needs):
        """Runs one check; a check returns a short detail (printed) and may leave a result
        for later checks in self.results[name]. `needs` names checks whose results it uses."""
        if self.unreachable:
            self.fail(name, f"not run: {self.unreachable}")
            return
        missing = [n for n in needs if n not in self.results]
        if missing:
            self.fail(name, f"needs {', '.join(missing)}, which failed")
            return
        try:
            detail = function(*[self.results[n] for n in needs])
        except CheckFailed as e:
            self.fail(name, str(e))
        except openai.APIStatusError as e:
            self.fail(name, f"HTTP {e.status_code} {type(e).__name__}: {e.message}")
        except openai.APIConnectionError as e:  # and APITimeoutError: the rest would wait too
            self.unreachable = f"the server did not answer ({type(e).__name__}: {e})"
            self.fail(name, self.unreachable)
        except openai.APIError as e:
            self.fail(name, f"{type(e).__name__}: {e}")
        except Exception as e:  # a bug in the response's shape (None where a value was due)
            last = traceback.extract_tb(e.__traceback__)[-1]
            self.fail(name, f"{type(e).__name__}: {e} (line {last.lineno})")
        else:
            if isinstance(detail, tuple):
                detail, self.results[name] = detail
            else:
                self.results[name] = None
            self.passed += 1
            print(f"ok   {name}: {detail}", flush=True)

    def fail(self, name, why):
        self.failed += 1
        print(f"FAIL {name}: {why}", flush=True)


def check_usage(usage, max_tokens=MAX_TOKENS):
    expect(usage is not None, "no usage")
    p, c, t = usage.prompt_tokens, usage.completion_tokens, usage.total_tokens
    expect(isinstance(p, int) and p > 0, f"usage.prompt_tokens {p!r}, want > 0")
    expect(isinstance(c, int) and 1 <= c <= max_tokens,
           f"usage.completion_tokens {c!r}, want 1..={max_tokens}")
    expect(t == p + c, f"usage.total_tokens {t!r} != {p} + {c}")
    return (p, c, t)


def extra(obj, field):
    """A field the openai types do not declare (kiln's token_ids), or None."""
    value = getattr(obj, field, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(field)
    return value


def one_choice(response):
    expect(response.choices is not None and len(response.choices) == 1,
           f"{0 if response.choices is None else len(response.choices)} choices, want 1")
    return response.choices[0]


def main():
    parser = argparse.ArgumentParser(
        description="Checks `kiln serve` through the official openai client.",
        epilog="Example: python3 tests/python/openai_client.py http://127.0.0.1:8000/v1 qwen-0.5b")
    parser.add_argument("base_url", metavar="BASE_URL",
                        help="the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("model", metavar="MODEL_ID", help="the id GET /v1/models lists")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key="unused", timeout=60, max_retries=0)
    model = args.model
    checks = Checks()

    def models():
        ids = [m.id for m in client.models.list()]
        expect(model in ids, f"{model!r} not among the listed models {ids!r}")
        return f"{model!r} in {ids!r}"

    def completion():
        r = complete()
        choice = one_choice(r)
        expect(isinstance(choice.text, str), f"text is {type(choice.text).__name__}, want str")
        expect(choice.finish_reason in FINISH,
               f"finish_reason {choice.finish_reason!r}, want one of {sorted(FINISH)}")
        usage = check_usage(r.usage)
        return (f"{choice.text!r} finish={choice.finish_reason} usage={usage}",
                (choice.text, choice.finish_reason, usage))

    def streamed_text(chunks, text_of, want_object):
        """Joined text, the last finish_reason, chunk count, usage chunk (None if none)."""
        parts, finish, count, usage = [], None, 0, None  # finish: the last choice's
        for chunk in chunks:
            count += 1
            expect(usage is None, "a chunk after the usage chunk")
            expect(chunk.object == want_object,
                   f"chunk {count} has object {chunk.object!r}, want {want_object!r}")
            if chunk.usage is not None:
                expect(not chunk.choices,
                       f"chunk {count} has usage and {len(chunk.choices)} choices")
                usage = chunk.usage
                continue
            expect(chunk.choices is not None and len(chunk.choices) <= 1,
                   f"chunk {count} has {len(chunk.choices or [])} choices, want 1")
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            expect(choice.index == 0, f"chunk {count} choice index {choice.index}")
            parts.append(text_of(choice, count))
            finish = choice.finish_reason
        expect(count > 0, "no chunks")
        return "".join(parts), finish, count, usage

    def compare_stream(want, got):
        text, finish, _ = want
        s_text, s_finish, count, _ = got
        expect(s_text == text, f"streamed text {s_text!r} != non-streamed {text!r}")
        expect(s_finish == finish,
               f"last chunk's finish_reason {s_finish!r} != non-streamed {finish!r}")
        return f"{count} chunks, text and finish_reason equal"

    def complete(**params):  # the greedy completion of PROMPT, or as params change it
        return client.completions.create(
            **{"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
               **params})

    def converse(**params):
        return client.chat.completions.create(
            **{"model": model, "messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0,
               **params})

    def completion_text(choice, count):
        expect(isinstance(choice.text, str), f"chunk {count} text is {type(choice.text).__name__}")
        return choice.text

    def chat_text(choice, count):
        delta = choice.delta
        expect(delta is not None, f"chunk {count} has no delta")
        if delta.role is not None:
            expect(delta.role == "assistant", f"chunk {count} delta.role {delta.role!r}")
        content = delta.content if delta.content is not None else ""
        expect(isinstance(content, str), f"chunk {count} delta.content is {type(content).__name__}")
        return content

    def stream_check(create, text_of, want_object):
        def check(want):
            got = streamed_text(create(stream=True), text_of, want_object)
            expect(got[3] is None, "a usage chunk although stream_options did not ask for one")
            return compare_stream(want, got)
        return check

    def usage_check(create, text_of, want_object):
        def check(want):
            got = streamed_text(create(stream=True, stream_options={"include_usage": True}),
                                text_of, want_object)
            expect(got[3] is not None, "no final chunk with usage")
            usage = check_usage(got[3])
            expect(usage == want[2], f"streamed usage {usage} != non-streamed {want[2]}")
            compare_stream(want, got)
            return f"the final chunk alone has usage={usage}, and no choices"
        return check

    def chat():
        r = converse()
        choice = one_choice(r)
        message = choice.message
        expect(message.role == "assistant", f"message.role {message.role!r}, want 'assistant'")
        expect(isinstance(message.content, str),
               f"message.content is {type(message.content).__name__}, want str")
        expect(choice.finish_reason in FINISH,
               f"finish_reason {choice.finish_reason!r}, want one of {sorted(FINISH)}")
        usage = check_usage(r.usage)
        return (f"{message.content!r} finish={choice.finish_reason} usage={usage}",
                (message.content, choice.finish_reason, usage))

    def bad_request(**params):
        def check():
            try:
                complete(**params)
            except openai.BadRequestError as e:
                body = e.body
                expect(isinstance(body, dict), f"error body {body!r} is not an object")
                expect(isinstance(body.get("message"), str) and body["message"],
                       f"error body {body!r} has no message")
                missing = [k for k in ("type", "param", "code") if k not in body]
                expect(not missing, f"error body {body!r} lacks {', '.join(missing)}")
                return f"400 {body.get('type')!r}: {body['message']}"
            except openai.APIStatusError as e:
                raise CheckFailed(f"HTTP {e.status_code} {type(e).__name__}, want 400 "
                                  f"BadRequestError: {e.message}")
            raise CheckFailed(f"{params} was accepted, want openai.BadRequestError")
        return check

    def token_prompt():
        r = complete(prompt=[1, 2, 3])
        choice = one_choice(r)
        expect(isinstance(choice.text, str), f"text is {type(choice.text).__name__}, want str")
        expect(choice.finish_reason in FINISH, f"finish_reason {choice.finish_reason!r}")
        usage = check_usage(r.usage)
        expect(usage[0] == 3, f"usage.prompt_tokens {usage[0]}, want 3 (the ids sent)")
        return f"{choice.text!r} usage={usage}"

    def token_ids(want):
        r = complete(extra_body={"return_token_ids": True})
        choice = one_choice(r)
        ids = extra(choice, "token_ids")
        expect(isinstance(ids, list) and all(isinstance(i, int) for i in ids),
               f"choice.token_ids {ids!r}, want a list of ints")
        usage = check_usage(r.usage)
        expect(len(ids) == usage[1],
               f"{len(ids)} token_ids but usage.completion_tokens {usage[1]}")
        expect(choice.text == want[0], f"text {choice.text!r} != without token ids {want[0]!r}")
        return f"{ids}", ids

    def token_ids_stream(want):
        ids, count = [], 0
        for chunk in complete(stream=True, extra_body={"return_token_ids": True}):
            count += 1
            for choice in chunk.choices or []:
                got = extra(choice, "token_ids")
                expect(got is None or (isinstance(got, list)
                                       and all(isinstance(i, int) for i in got)),
                       f"chunk {count} token_ids {got!r}, want a list of ints")
                ids.extend(got or [])
        expect(ids == want, f"streamed token_ids {ids} != non-streamed {want}")
        return f"{count} chunks, ids equal"

    checks.run("models", models)
    checks.run("completion", completion)
    checks.run("completion-stream",
               stream_check(complete, completion_text, "text_completion"), "completion")
    checks.run("completion-usage",
               usage_check(complete, completion_text, "text_completion"), "completion")
    checks.run("chat", chat)
    checks.run("chat-stream", stream_check(converse, chat_text, "chat.completion.chunk"), "chat")
    checks.run("chat-usage", usage_check(converse, chat_text, "chat.completion.chunk"), "chat")
    checks.run("bad-max-tokens", bad_request(max_tokens=0))
    checks.run("bad-temperature", bad_request(temperature=-1))
    checks.run("token-prompt", token_prompt)
    checks.run("token-ids", token_ids, "completion")
    checks.run("token-ids-stream", token_ids_stream, "token-ids")

    total = checks.passed + checks.failed
    if checks.failed:
        print(f"FAILED: {checks.failed} of {total} checks failed ({args.base_url}, {model!r})")
        sys.exit(1)
    print(f"PASSED: all {total} checks ({args.base_url}, {model!r})")


if __name__ == "__main__":
    main()
