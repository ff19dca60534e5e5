"""ebpo.data.prompts: auto | on | off, the rendered prompts by hand, and every entry point reading the same ids.

The chat model is the session's tiny Qwen3 with a ChatML template (``chat_model_dir``); the character model
(``tiny_model_dir``) has no template, as the built-in ``arith`` model.
"""

from __future__ import annotations

import pytest

from ebpo import generation
from ebpo.data.prompts import PromptFormat, apply_chat_template, conversation, prompt_text
from ebpo.data.records import Record
from ebpo.errors import ConfigError


@pytest.fixture(scope="module")
def chat_tokenizer(chat_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_model_dir)


@pytest.fixture(scope="module")
def char_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def hf_chat_ids(tokenizer, prompt: str) -> list[int]:
    """What transformers' own ``apply_chat_template(tokenize=True)`` gives: TRL's conversational prompts and
    verl's chat rows are tokenized this way."""
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_auto_on_off(chat_tokenizer, char_tokenizer):
    assert PromptFormat.resolve(chat_tokenizer, "auto").chat is True
    assert PromptFormat.resolve(chat_tokenizer, "on").chat is True
    assert PromptFormat.resolve(chat_tokenizer, "off").chat is False
    assert PromptFormat.resolve(char_tokenizer, "auto").chat is False  # the built-in model: raw prompts
    assert PromptFormat.resolve(char_tokenizer, "off").chat is False
    with pytest.raises(ConfigError) as err:
        PromptFormat.resolve(char_tokenizer, "on", option="data.chat_template", source="models/char")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("data.chat_template=on, but the tokenizer of models/char has no chat template")
    assert "set data.chat_template=off (or auto)" in message
    with pytest.raises(
        ConfigError, match="unknown data.chat_template setting 'yes'; valid choices: auto, off"
    ):
        PromptFormat.resolve(chat_tokenizer, "yes", option="data.chat_template")
    # the resolved format as a setting resolves to itself again (ebpo eval keys its cache on it)
    for setting in ("auto", "on", "off"):
        prompt_format = PromptFormat.resolve(chat_tokenizer, setting)
        assert PromptFormat.resolve(chat_tokenizer, prompt_format.setting) == prompt_format


def test_chat_and_raw_ids_by_hand(chat_tokenizer, char_tokenizer):
    record = Record(id="r", prompt="What is 3 + 4?", answer="7")
    chat = PromptFormat.resolve(chat_tokenizer, "auto")
    assert chat.texts([record]) == ["<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"]
    (ids,) = chat.ids([record])
    im_start, im_end = chat_tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert (im_start, im_end) == (1, 2)
    # specials once each where the template writes them, none added in front
    assert ids[0] == im_start and ids.count(im_start) == 2 and ids.count(im_end) == 1
    assert chat_tokenizer.decode(ids) == chat.texts([record])[0]
    assert ids == hf_chat_ids(chat_tokenizer, record.prompt)
    # the same problem as a string or as its messages
    assert chat.ids([record.prompt]) == chat.ids([[{"role": "user", "content": record.prompt}]]) == [ids]

    raw = PromptFormat.resolve(chat_tokenizer, "off")
    assert raw.texts([record]) == [record.prompt]
    assert raw.ids([record]) == [chat_tokenizer(record.prompt)["input_ids"]]
    char = PromptFormat.resolve(char_tokenizer, "auto")
    assert char.ids([record]) == [[char_tokenizer.convert_tokens_to_ids(c) for c in record.prompt]]


def test_conversation_and_text_of_each_kind_of_prompt():
    dapo = Record(id="d", prompt="flat", answer="1", extra={"messages": [{"role": "user", "content": "own"}]})
    assert conversation(dapo) == [{"role": "user", "content": "own"}]  # a loader's conversation wins
    assert conversation(Record(id="r", prompt="p", answer="1")) == [{"role": "user", "content": "p"}]
    assert conversation("p", "Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "p"},
    ]
    own_system = [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}]
    assert conversation(own_system, "ignored") == own_system
    assert prompt_text(own_system) == "u" and prompt_text(dapo) == "flat" and prompt_text("p") == "p"


def test_system_prompt_goes_through_the_template(chat_tokenizer):
    rendered = apply_chat_template(["Hi"], chat_tokenizer, system_prompt="Be brief.")
    assert rendered == [
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ]
    with_system = PromptFormat.resolve(chat_tokenizer, "on", system_prompt="Be brief.")
    assert with_system.texts(["Hi"]) == rendered


def test_every_entry_point_reads_the_same_prompt_ids(chat_model_dir, chat_tokenizer, tmp_path, monkeypatch):
    """`ebpo train` (rollouts and validation), `ebpo eval` on the trained run, `ebpo diagnose` and `ebpo annotate
    difficulty` give the model the same ids for the same problems: the template's, as transformers renders
    them. Also the tiny end-to-end `ebpo train` + `ebpo eval` of the chat model with the template on."""
    import torch

    import ebpo
    from ebpo.annotate.difficulty import DifficultyConfig, annotate_difficulty
    from ebpo.data.loaders import write_records
    from ebpo.eval import cli as eval_cli
    from ebpo.eval.benchmarks import get_benchmark
    from ebpo.trainer.trainer import Trainer
    from helpers.trainer import tiny_config

    records = get_benchmark("arith").load()[:6]  # what `ebpo eval --benchmarks arith --limit 6` reads
    expected = [hf_chat_ids(chat_tokenizer, r.prompt) for r in records]
    data = write_records(tmp_path / "records.jsonl", records)

    calls: list[list[list[int]]] = []
    encode = generation._encode_prompts

    def spy(tokenizer, prompts):
        calls.append(encode(tokenizer, prompts))
        return calls[-1]

    monkeypatch.setattr(generation, "_encode_prompts", spy)

    def ids_of_the_next_calls(run) -> list[list[list[int]]]:
        first = len(calls)
        run()
        return calls[first:]

    cfg = tiny_config(
        chat_model_dir,
        f"data.train_file={data}",
        f"data.val_file={data}",
        "data.batch_size=6",
        "data.chat_template=on",
        "run.steps=1",
    )
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    validation, rollout, validation_after = ids_of_the_next_calls(trainer.train)
    assert validation == validation_after == expected  # in record order
    assert sorted(rollout) == sorted(expected)  # the six records, in the sampler's order
    assert trainer.eval_after["eval/pass@1"] >= 0

    args = eval_cli.build_parser().parse_args(
        [
            str(tmp_path / "run"),
            *("--benchmarks", "arith", "--limit", "6", "--n", "1", "--batch-size", "6"),
            *("--max-new-tokens", "4", "--chat-template", "on", "--no-cache", "--quiet"),
            *("--out-dir", str(tmp_path / "eval")),
        ]
    )
    assert ids_of_the_next_calls(lambda: eval_cli.run(args)) == [expected]
    assert (tmp_path / "eval" / "results.md").is_file()

    model = trainer.model
    diagnose_calls = ids_of_the_next_calls(
        lambda: ebpo.diagnose(
            model=model,
            tokenizer=chat_tokenizer,
            records=records,
            estimators=["grpo"],
            compare_to="grpo",
            group_sizes=[2],
            prompts=6,
            batches=2,
            warmup_batches=0,
            reference_samples=4,
            max_new_tokens=2,
            projection_dim=0,
            quiet=True,
        )
    )
    assert len(diagnose_calls) == 2 and all(sorted(ids) == sorted(expected) for ids in diagnose_calls)

    annotate = DifficultyConfig(
        model=str(chat_model_dir), reward="arith", k=1, max_new_tokens=2, prompts_per_call=6
    )
    out = tmp_path / "difficulty.jsonl"
    with torch.no_grad():
        annotate_calls = ids_of_the_next_calls(
            lambda: annotate_difficulty(data, out, annotate, progress=False, schema="records")
        )
    assert annotate_calls == [expected]


def test_chat_template_on_without_a_template_is_one_line(tiny_model_dir, tmp_path, capsys):
    from ebpo.eval import cli as eval_cli
    from ebpo.trainer.trainer import Trainer
    from helpers.trainer import tiny_config

    with pytest.raises(
        ConfigError, match=r"^data.chat_template=on, but the tokenizer of .* has no chat template"
    ):
        Trainer(tiny_config(tiny_model_dir, "data.chat_template=on"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written
    args = eval_cli.build_parser().parse_args(
        [str(tiny_model_dir), "--benchmarks", "arith", "--chat-template", "on", "--no-cache", "--quiet"]
    )
    assert eval_cli.run(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert (
        err.startswith("ebpo eval: error: --chat-template=on, but the tokenizer of")
        and "--chat-template=off" in err
    )


# -- chat templates -----------------------------------------------------------------------------------

# A minimal ChatML-like template: each turn "<|role|>content\n", then "<|assistant|>" for generation.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_apply_chat_template_renders_through_the_tokenizer():
    from ebpo.models.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    records = [Record(id="a", prompt="1+1=?", answer="2")]
    with pytest.raises(ValueError, match="no chat_template"):
        apply_chat_template(records, tokenizer)

    tokenizer.chat_template = TEMPLATE
    assert apply_chat_template(records, tokenizer) == ["<|user|>1+1=?\n<|assistant|>"]
    assert apply_chat_template(records, tokenizer, system_prompt="Be brief.") == [
        "<|system|>Be brief.\n<|user|>1+1=?\n<|assistant|>"
    ]
    assert apply_chat_template(records, tokenizer, add_generation_prompt=False) == ["<|user|>1+1=?\n"]
    # DAPO keeps the original conversation, which wins over the flat prompt
    dapo = Record(
        id="d",
        prompt="Q",
        answer="1",
        extra={"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]},
    )
    assert apply_chat_template([dapo], tokenizer, system_prompt="ignored") == [
        "<|system|>S\n<|user|>Q\n<|assistant|>"
    ]
