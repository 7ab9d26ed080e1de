"""The child process that converts JSON schemas to GBNF and compiles grammars with llama.cpp, so
that a schema or grammar that makes either misbehave (a stack overflow, gigabytes of memory, a
long compile) costs this process, never the server (:mod:`runner.sample.grammarcheck` runs it).

It imports nothing of pollama: run it as ``python -I grammarchild.py``. It reads one JSON line
per job on stdin and answers one JSON line on stdout:

- ``{"schema": {...}, "max_chars": N}`` -> ``{"gbnf": "..."}``: llama-cpp-python's converter,
  then a compile of the result;
- ``{"gbnf": "...", "max_chars": N}`` -> ``{"gbnf": "..."}``: a compile;
- either -> ``{"error": "one line"}`` when it does not convert or compile, or the grammar is
  longer than ``max_chars``.

Memory is capped (``RLIMIT_DATA``); llama.cpp's log stays in this process, its parse error
becomes the answer's one line.
"""

from __future__ import annotations

import json
import resource
import sys

MEMORY = 1 << 30  # bytes of heap this process may use
MAX_REASON = 200  # characters of an error kept for the answer


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON else line[:MAX_REASON] + "..."


def main() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY, MEMORY))
    import llama_cpp as L
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    errors: list[str] = []

    def keep(level: int, text: bytes, _user: object) -> None:
        message = (text or b"")[:1000].decode("utf-8", errors="replace")
        if "error parsing grammar" in message and not errors:
            errors.append(message.split("error parsing grammar:", 1)[1])

    callback = L.llama_log_callback(keep)
    L.llama_log_set(callback, None)

    def compile_(gbnf: str) -> str | None:
        errors.clear()
        sampler = L.llama_sampler_init_grammar(None, gbnf.encode(), b"root")
        if not sampler:
            return _one_line(errors[0]) if errors else "the grammar does not compile"
        L.llama_sampler_free(sampler)
        return None

    for line in sys.stdin:
        job = json.loads(line)
        try:
            gbnf = job["gbnf"] if "gbnf" in job else json_schema_to_gbnf(json.dumps(job["schema"]))
            if len(gbnf) > job["max_chars"]:
                problem = f"the grammar is {len(gbnf)} characters, over the limit of {job['max_chars']}"
            else:
                problem = compile_(gbnf)
            answer = {"error": problem} if problem else {"gbnf": gbnf}
        except RecursionError:
            answer = {"error": "the schema nests too deeply"}
        except MemoryError:
            answer = {"error": "the grammar needs too much memory"}
        except Exception as err:  # the converter raises assorted errors on bad schemas
            answer = {"error": _one_line(str(err) or type(err).__name__)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
