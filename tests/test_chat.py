"""A steered chat on the default model: every turn of every side is exactly the plain
request of that side's history (``Chat.request``), decoded alone; the history carries the
replies as generated; every operation keeps that, and a record replays every turn."""

from __future__ import annotations

import pytest
import torch

import steer_widgets as sw

SOURCE = "10-smollm2-res-4k"
MESSAGES = ["What should I cook tonight?", "Something quicker, please.", "And a dessert?"]


def _chat(engine, **kw) -> sw.Chat:
    settings = dict(
        features=[sw.Feature(SOURCE, 100, 30.0)], sweep=(2.0,), n_completion_tokens=10,
        temperature=0.8, seed=3,
    )  # fmt: skip
    return engine.chat(**{**settings, **kw})


def _same(a: sw.Completion, b: sw.Completion) -> bool:
    return a == b and a.token_probs == b.token_probs


def _exact(engine, chat: sw.Chat) -> None:
    """The last turn of every side equals its plain request run alone."""
    for side in chat.sides:
        alone = engine.steer(chat.request(side)).outputs
        assert _same(next(iter(alone.values())), chat.turns[-1].replies[side]), side


def test_every_turn_of_every_side_is_its_plain_request(engine):
    vector = sw.Vector(torch.randn(576, generator=torch.Generator().manual_seed(2)),
                       "blocks.15.hook_resid_post", 6.0)  # fmt: skip
    chat = _chat(engine, vectors=[vector], prompt_multiplier=2.0, steer_special_tokens=False,
                 system="You are a terse cook.")  # fmt: skip
    assert chat.sides == ["DEFAULT", "STEERED", "STEERED*2"]
    for k, message in enumerate(MESSAGES):
        replies = chat.say(message)
        assert list(replies) == chat.sides and chat.turns[-1].seed == 3 + k
        _exact(engine, chat)
    steered = [t.replies["STEERED"].token_ids for t in chat.turns]
    assert steered != [t.replies["DEFAULT"].token_ids for t in chat.turns]
    history = chat.history("STEERED")
    assert [m["role"] for m in history] == ["system"] + ["user", "assistant"] * 3
    for turn, reply in zip(chat.turns, history[2::2], strict=True):  # as generated
        ids = list(turn.replies["STEERED"].token_ids)
        assert reply["token_ids"] == [i for i in ids if i not in engine.decoder.stop_ids]
    enc = engine.text(chat.request("STEERED", "one more").prompt).ids  # the spliced history
    prompt = engine.tokenizer.encode(chat.request("STEERED", "one more").prompt)
    assert tuple(enc) == prompt.ids and sum(prompt.generated) == sum(
        len(m["token_ids"]) for m in history[2::2]
    )


def test_the_stream_ends_in_the_replies_say_gives(engine):
    streamed, said = _chat(engine), _chat(engine)
    for message in MESSAGES[:2]:
        frames = list(streamed.say_stream(message))
        assert frames[-1].done and not any(f.done for f in frames[:-1])
        for a, b in zip(frames, frames[1:], strict=False):  # each frame extends the last
            for side in streamed.sides:
                assert b.outputs[side].token_ids[: len(a.outputs[side].token_ids)] == (
                    a.outputs[side].token_ids
                )
        assert frames[-1].outputs == said.say(message)
    assert len(streamed.turns) == 2
    unfinished = streamed.say_stream(MESSAGES[2])
    next(unfinished)
    unfinished.close()  # a turn whose stream was dropped is not kept
    assert len(streamed.turns) == 2


def test_regenerate_undo_edit_set_and_replay_keep_every_turn_exact(engine):
    chat = _chat(engine)
    for message in MESSAGES[:2]:
        chat.say(message)
    before = chat.turns
    again = chat.regenerate()
    assert chat.turns[-1].seed == before[-1].seed + 1 and again == chat.turns[-1].replies
    _exact(engine, chat)
    dropped = chat.undo()
    assert dropped.message == MESSAGES[1] and dropped.replies == again
    assert len(chat.turns) == 1 and chat.turns[0] == before[0]
    chat.say(MESSAGES[1])
    edited = chat.edit(0, "What should I bake?")
    assert [t.message for t in chat.turns] == ["What should I bake?", MESSAGES[1]]
    assert [t.seed for t in chat.turns] == [t.seed for t in before]
    assert edited == [t.replies for t in chat.turns]
    _exact(engine, chat)
    chat.set(strength_multiplier=3.0)
    chat.say(MESSAGES[2])
    assert chat.turns[-1].steering.strength_multiplier == 3.0
    assert chat.turns[0].steering.strength_multiplier == 1.0
    _exact(engine, chat)
    defaults = [t.replies["DEFAULT"] for t in chat.turns]
    chat.replay_steered()
    assert [t.replies["DEFAULT"] for t in chat.turns] == defaults
    assert all(t.steering.strength_multiplier == 3.0 for t in chat.turns)
    _exact(engine, chat)
    record = chat.to_dict()
    replayed = engine.chat(record)
    assert replayed.to_dict() == record


def test_bad_input_is_named_before_any_work_and_the_chat_is_as_it_was(engine):
    chat = _chat(engine)
    chat.say(MESSAGES[0])
    kept = chat.to_dict()
    forwards = engine.residual_cache.forwards
    cases = [
        (lambda: chat.say(""), "text"),
        (lambda: chat.say(7), "text"),
        (lambda: chat.edit(3, "x"), "turn"),
        (lambda: chat.edit(0, " "), "text"),
        (lambda: chat.set(sweep=(3.0,)), "sweep"),
        (lambda: chat.set(seed=-1.5), "seed"),
        (lambda: chat.set(features=[sw.Feature("no-such-sae", 1)]), "features[0]"),
        (lambda: chat.history("STEERED*9"), "side"),
        (lambda: engine.chat(prompt="Hi"), "prompt"),
        (lambda: engine.chat(temperatur=1.0), "temperatur"),
        (lambda: _chat(engine, when=sw.When.tokens(2)), "when"),
        (lambda: engine.chat({**kept, "model": "gpt2"}), "record.model"),
        (lambda: engine.chat({**kept, "turns": [{"message": "", "seed": 1}]}),
         "record.turns[0].message"),
    ]  # fmt: skip
    for call, field in cases:
        with pytest.raises(sw.RequestError) as err:
            call()
        assert err.value.field == field, (field, err.value)
    assert chat.to_dict() == kept and engine.residual_cache.forwards == forwards
    fresh = _chat(engine)
    with pytest.raises(sw.RequestError) as err:
        fresh.undo()
    assert err.value.field == "undo"


def test_a_readout_reads_every_reply_under_the_unsteered_model(engine):
    chat = _chat(engine, sweep=())
    for message in MESSAGES[:2]:
        chat.say(message)
    feature = sw.Feature(SOURCE, 100)
    out = chat.readout(feature)
    frame = out.frame()
    assert list(frame["side"]) == ["DEFAULT", "STEERED"] * 2 and list(frame["turn"]) == [0, 0, 1, 1]
    history = chat.history("STEERED")
    reply = chat.turns[1].replies["STEERED"]
    text = engine.text(history[:3], reply)  # turn 1's prompt, then its reply
    values = engine.feature_values(text, SOURCE, 100)
    n = len([i for i in reply.token_ids if i not in engine.decoder.stop_ids])
    read = values[len(text.ids) - len(reply.token_ids) :][:n]
    row = frame[(frame["turn"] == 1) & (frame["side"] == "STEERED")].iloc[0]
    assert row["n"] == n and row["max"] == pytest.approx(float(read.max()), abs=1e-4)
    assert row["mean"] == pytest.approx(float(read.mean()), abs=1e-4)
    svg = out.svg()
    assert svg.count('class="sw-turn"') == 4 and "DEFAULT" in svg and "STEERED" in svg
    vector = sw.Vector(torch.randn(576, generator=torch.Generator().manual_seed(4)),
                       "blocks.12.hook_resid_post")  # fmt: skip
    cosines = chat.readout(vector).frame()
    assert cosines["max"].between(-1, 1).all()
    with pytest.raises(sw.RequestError) as err:
        chat.readout("STEERED")
    assert err.value.field == "target"
