"""``ebpo annotate difficulty``: each prompt's pass rate under a model (docs/design.md §4; paper appendix).

difficulty(q) = c_q / k, where c_q is the number of the k responses sampled from the model at temperature T
(the paper: k = 16, T = 1.0, the base model) that the reward scores as correct (reward > threshold,
0.5 by default, so +1/-1 rewards work too). Higher means easier; the ``difficulty`` sampler puts high
pass rates first.

Resumable: prompts are processed in fixed chunks of ``prompts_per_call`` (chunk c = rows
``[c*P, (c+1)*P)`` of the input), each chunk sampled with its own generator seeded by ``(seed, c)``,
and each chunk's finished prompts are appended to ``{output}.partial.jsonl`` (an :class:`ebpo.persist.Journal`:
a torn last line is dropped with a warning and redone). A restart skips the prompts found
there (a chunk already partly done is regenerated with the same seed, and only its missing prompts are
written), so an interrupted-then-resumed run writes the same file as an uninterrupted one. When every
prompt is done, the output (input columns + ``difficulty``) is written and the partial file removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebpo.annotate import load_input, row_answer, row_id, row_prompt, write_output
from ebpo.data.prompts import ChatTemplateSetting, PromptFormat
from ebpo.persist import Journal

__all__ = ["DifficultyConfig", "annotate_difficulty", "partial_path", "chunk_seed"]


@dataclass
class DifficultyConfig:
    """Settings of ``ebpo annotate difficulty``; every field is a flag (``--model``, ``--k``, ...)."""

    model: str = field(
        metadata={
            "help": "Hugging Face model directory or name (the base model whose pass rate defines difficulty)"
        }
    )
    reward: str = field(
        default="math", metadata={"help": "reward name from ebpo.rewards (math, math_dapo, arith)"}
    )
    k: int = field(default=16, metadata={"help": "samples per prompt (16 in the paper)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (1.0 in the paper)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass (1.0: off)"})
    max_new_tokens: int = field(default=1024, metadata={"help": "longest response"})
    prompts_per_call: int = field(
        default=8,
        metadata={
            "help": "prompts sampled together in one generation.sample call, k rows each; keep it fixed "
            "across a resume"
        },
    )
    seed: int = field(default=0, metadata={"help": "sampling seed; chunk c uses chunk_seed(seed, c)"})
    threshold: float = field(
        default=0.5, metadata={"help": "a sample counts as correct when its reward is above this"}
    )
    chat_template: ChatTemplateSetting = field(
        default="auto",
        metadata={
            "help": "render prompts with the tokenizer's chat template: auto (when it has one) | on | off (a "
            "prompt of chat messages then reads its last user message), as ebpo train and ebpo eval; "
            "--chat-template alone is on, --no-chat-template off",
            "nargs": "?",
            "const": "on",
        },
    )
    device: str | None = field(
        default=None, metadata={"help": "torch device (default: cuda if available, else cpu)"}
    )
    dtype: str = field(default="auto", metadata={"help": "model dtype: auto, float32, bfloat16, float16"})

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"annotate difficulty: k must be >= 1, got {self.k}")
        if self.prompts_per_call < 1:
            raise ValueError(
                f"annotate difficulty: prompts_per_call must be >= 1, got {self.prompts_per_call}"
            )
        if self.temperature < 0:
            raise ValueError(f"annotate difficulty: temperature must be >= 0, got {self.temperature}")


def partial_path(output: str | Path) -> Path:
    """Where finished prompts are appended while a run is in progress."""
    output = Path(output)
    return output.with_name(output.name + ".partial.jsonl")


def chunk_seed(seed: int, chunk: int) -> int:
    """Seed of chunk ``chunk``'s generator: a fixed mix of the run seed and the chunk number."""
    return (int(seed) * 1_000_003 + int(chunk)) % (2**63 - 1)


def _partial_journal(path: Path) -> Journal:
    """The partial file as a journal: one finished prompt a line (``id``, ``num_correct``, ``k``, ``difficulty``)."""
    return Journal(path, kind="a finished prompt", fix="delete it to restart")


def _finished(row: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return str(row["id"]), row


def _load_model(cfg: DifficultyConfig) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = cfg.dtype if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    # transformers wraps PreTrainedModel.to in functools.wraps: mypy sees an unbound _Wrapped (self first)
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype).to(device)  # type: ignore[arg-type]
    model.eval()
    return model, tokenizer


def annotate_difficulty(
    input_path: str | Path,
    output_path: str | Path,
    cfg: DifficultyConfig,
    *,
    model: Any = None,
    tokenizer: Any = None,
    reward: Any = None,
    progress: bool = True,
    schema: str | None = None,
) -> list[dict[str, Any]]:
    """Write ``output_path`` = input rows + ``difficulty`` (pass rate over ``cfg.k`` samples); return the rows.

    ``model`` / ``tokenizer`` / ``reward`` may be passed in (already loaded); by default they come from
    ``cfg.model`` and ``ebpo.rewards.get_reward(cfg.reward)``. ``schema``: read the input with that
    ``ebpo.data.loaders`` schema and write records (see :func:`ebpo.annotate.load_input`). Raises ``ValueError`` on duplicate ids
    (resuming matches prompts by id) and on rows without a prompt or answer (naming the row).
    """
    import torch
    from tqdm.auto import tqdm

    from ebpo.generation import sample

    input_path, output_path = Path(input_path), Path(output_path)
    if output_path.resolve() == input_path.resolve():
        raise ValueError(
            f"annotate difficulty: output {output_path} would overwrite the input; pick a new file"
        )
    rows = load_input(input_path, schema)
    ids = [row_id(row, i) for i, row in enumerate(rows)]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise ValueError(f"{input_path}: id {dup!r} appears more than once; ids must be unique to resume")
    prompts = [row_prompt(row, i, input_path) for i, row in enumerate(rows)]
    answers = [row_answer(row, i, input_path) for i, row in enumerate(rows)]

    part = partial_path(output_path)
    journal = _partial_journal(part)
    done = dict(journal.read(_finished, repair=True))  # this run is its one writer: a torn last line goes
    if done and (next(iter(done.values())).get("k") != cfg.k):
        raise ValueError(
            f"{part} was written with k={next(iter(done.values())).get('k')}, this run has k={cfg.k}"
        )
    todo = [i for i, x in enumerate(ids) if x not in done]
    if todo and model is None:
        model, tokenizer = _load_model(cfg)
    if todo and reward is None:
        from ebpo.rewards import get_reward

        reward = get_reward(cfg.reward)

    prompt_format: PromptFormat | None = None
    if todo:  # the prompts as ebpo train and ebpo eval give them to the model
        prompt_format = PromptFormat.resolve(
            tokenizer, cfg.chat_template, option="--chat-template", source=cfg.model
        )
    P = cfg.prompts_per_call
    bar = tqdm(
        total=len(rows), initial=len(rows) - len(todo), desc="difficulty", unit="prompt", disable=not progress
    )
    for chunk in range((len(rows) + P - 1) // P):
        members = range(chunk * P, min(len(rows), (chunk + 1) * P))
        if all(ids[i] in done for i in members):
            continue
        generator = torch.Generator().manual_seed(chunk_seed(cfg.seed, chunk))
        assert prompt_format is not None  # set above: this chunk has prompts to do
        rollouts = sample(
            model,
            tokenizer,
            prompt_format.ids([prompts[i] for i in members]),
            n=cfg.k,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            generator=generator,
        )
        gold = [answers[i] for i in members for _ in range(cfg.k)]
        rewards = reward.batch(rollouts.texts, gold)
        finished = []
        for j, i in enumerate(members):
            if ids[i] in done:
                continue
            num_correct = sum(r > cfg.threshold for r in rewards[j * cfg.k : (j + 1) * cfg.k])
            finished.append(
                {"id": ids[i], "num_correct": int(num_correct), "k": cfg.k, "difficulty": num_correct / cfg.k}
            )
        journal.append(finished)  # the chunk's prompts, appended whole
        for result in finished:
            done[result["id"]] = result
        bar.update(len(finished))
    bar.close()
    out_rows = [{**row, "difficulty": done[ids[i]]["difficulty"]} for i, row in enumerate(rows)]
    write_output(output_path, out_rows, schema)
    part.unlink(missing_ok=True)
    return out_rows
