"""runner.loop.output without a model: sampled tokens as bytes in, chunks out (reference §1.6)."""

from __future__ import annotations

import queue

from runner.api import DoneReason, TokenLogprob
from runner.loop.output import Output
from runner.loop.replies import ReplyParser
from runner.reply.thinking import ThinkingParser, ThinkTags


def drain(out: Output) -> list:
    items = []
    while True:
        try:
            items.append(out.sink.get_nowait())
        except queue.Empty:
            return items


def feed(out: Output, pieces: list[bytes], eog_at: int | None = None):
    """Feed pieces as tokens 100, 101, ...; the verdict of the last one fed."""
    verdict = None
    for k, piece in enumerate(pieces):
        verdict = out.token(100 + k, piece, eog=(k == eog_at))
        if verdict.done is not None:
            break
    return verdict


def texts(out: Output) -> list[str]:
    return [c.text for c in drain(out)]


def test_each_token_is_sent_as_soon_as_it_is_certain():
    out = Output(stops=[], num_predict=0)
    assert feed(out, [b"Hello", b",", b" world"]).done is None
    assert texts(out) == ["Hello", ",", " world"]
    assert out.generated == [100, 101, 102] and out.num_predicted == 3


def test_a_utf8_character_split_across_tokens_is_held_until_complete():
    out = Output(stops=[], num_predict=0)
    snowman = "☃".encode()  # three bytes
    feed(out, [b"a", snowman[:1], snowman[1:2], snowman[2:], b"b"])
    assert texts(out) == ["a", "☃", "b"]


def test_an_invalid_tail_is_dropped_when_the_reply_ends():
    out = Output(stops=[], num_predict=0)
    verdict = feed(out, [b"ok", "é".encode()[:1], b""], eog_at=2)
    assert verdict.done is DoneReason.STOP
    final = out.final(verdict.done, [1, 2])
    items = drain(out)
    assert [c.text for c in items] == ["ok", ""]  # the half character never reaches the client
    assert final.done and final.context == [1, 2, 100, 101]  # EOS is not part of the context


def test_a_stop_sequence_is_held_back_then_cut_with_the_slot_history():
    out = Output(stops=[b"User:"], num_predict=0)
    verdict = feed(out, [b"Fine", b".", b" Us", b"er", b":", b" more"])
    assert verdict.done is DoneReason.STOP
    # " Us" and "er" are in the KV cache; ":" (the last token) is not: drop the two before it
    assert verdict.drop == 2
    assert texts(out) == ["Fine", "."]
    out.final(verdict.done, [])
    assert "".join(texts(out)) == " "  # what came before the stop inside " Us"
    assert out.generated == [100, 101]


def test_a_stop_inside_one_token_keeps_that_token_out_of_the_slot():
    out = Output(stops=[b"\n\n"], num_predict=0)
    verdict = feed(out, [b"Done", b".\n\nNext"])
    assert verdict.done is DoneReason.STOP and verdict.drop == 0
    out.final(verdict.done, [])
    assert "".join(texts(out)) == "Done."
    assert out.generated == [100]


def test_the_last_chunk_names_the_stop_sequence_that_ended_the_output():
    out = Output(stops=[b"zz", "é!".encode()], num_predict=0)
    verdict = feed(out, [b"ok", "é".encode(), b"!"])
    assert verdict.done is DoneReason.STOP and out.final(verdict.done, []).stop == "é!"
    out = Output(stops=[b"zz"], num_predict=0)  # an end-of-generation token: no stop sequence
    assert out.final(feed(out, [b"a", b""], eog_at=1).done, []).stop is None


def test_a_held_prefix_that_turns_out_not_to_be_a_stop_is_sent():
    out = Output(stops=[b"STOP"], num_predict=0)
    feed(out, [b"ST", b"ay"])
    assert texts(out) == ["STay"]


def test_num_predict_ends_with_length_and_flushes_on_final():
    out = Output(stops=[b"xyz"], num_predict=3)
    verdict = feed(out, [b"a", b"b", b"x", b"never"])
    assert verdict.done is DoneReason.LENGTH
    final = out.final(verdict.done, [7])
    assert "".join(texts(out)) == "abx"  # the held "x" goes out with the end
    assert final.metrics.eval_count == 3 and final.context == [7, 100, 101, 102]


def test_logprobs_ride_with_their_text_and_are_cut_with_the_stop():
    out = Output(stops=[b"!!"], num_predict=0, top_logprobs=0)
    assert out.wants_logprobs
    lp = [TokenLogprob(token=t, logprob=-float(k), bytes=list(t.encode())) for k, t in enumerate(["a", "!", "!"])]
    out.token(100, b"a", False, lp[0])
    out.token(101, b"!", False, lp[1])
    verdict = out.token(102, b"!", False, lp[2])
    assert verdict.done is DoneReason.STOP
    out.final(verdict.done, [])
    chunks = drain(out)
    sent = [l.token for c in chunks for l in (c.logprobs or [])]
    assert "".join(c.text for c in chunks) == "a" and sent == ["a"]


def test_a_client_that_left_gets_no_held_text():
    out = Output(stops=[b"END"], num_predict=0)
    feed(out, [b"E"])
    final = out.final(DoneReason.CONNECTION_CLOSED, [])
    assert drain(out) == [] and final.done_reason is DoneReason.CONNECTION_CLOSED


def test_metrics_count_the_prompt_and_the_tokens():
    out = Output(stops=[], num_predict=0)
    out.started(cached=5, evaluated=7)
    feed(out, [b"x", b"y"])
    m = out.final(DoneReason.STOP, []).metrics
    assert (m.prompt_cached_count, m.prompt_eval_count, m.eval_count) == (5, 7, 2)
    assert m.prompt_eval_duration >= 0 and m.eval_duration >= 0
    assert m.load_duration == m.total_duration == 0  # the caller's: it knows when the request began


def test_thinking_is_split_from_the_answer():
    tags = ThinkTags("<think>", "</think>")
    out = Output(stops=[], num_predict=0, reply=ReplyParser(ThinkingParser(tags, opened=False), None))
    feed(out, [b"<think>", b"hmm", b"</think>", b"Yes"])
    out.final(DoneReason.STOP, [])
    chunks = drain(out)
    assert "".join(c.thinking for c in chunks) == "hmm"
    assert "".join(c.text for c in chunks) == "Yes"


def test_the_first_chunk_carries_the_prompts_counts():
    out = Output(stops=[], num_predict=0)
    out.started(cached=5, evaluated=7)
    feed(out, [b"x", b"y"])
    first, second = drain(out)
    assert (first.metrics.prompt_cached_count, first.metrics.prompt_eval_count, first.metrics.eval_count) == (5, 7, 0)
    assert not first.done and second.metrics is None
