"""How a problem becomes the tokens a model reads: its raw text, or the tokenizer's chat template.

Every entry point that samples from a model (``ebpo train`` and its validation, ``ebpo eval``, ``ebpo
diagnose``, ``ebpo annotate difficulty``, the TRL example) goes through :class:`PromptFormat`, so a model
reads the same prompt ids for the same problem wherever it runs:

```python
prompt_format = PromptFormat.resolve(tokenizer, "auto")  # the chat template when the tokenizer has one
prompt_format.texts(records)  # what the model reads, as text
prompt_format.ids(records)    # ... as token ids (what ebpo.generation.sample takes)
```

- **chat** (the tokenizer has a ``chat_template`` and the setting is ``auto`` or ``on``): the problem's
  conversation (:func:`conversation`: a loader's own messages, else one user turn with the prompt) rendered
  by ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``, then tokenized without adding
  special tokens, since the template writes its own: the ids ``apply_chat_template(tokenize=True)`` gives,
  which TRL (conversational prompts) and verl (chat ``prompt`` rows) use too.
- **raw** (``off``, or ``auto`` without a template: base models such as the built-in ``arith`` model): the
  prompt text (:func:`prompt_text`) through ``tokenizer(text)``, with the tokenizer's own special tokens.

``on`` with a tokenizer that has no template is one :class:`~ebpo.errors.ConfigError` line naming the option
and the fix. A prompt is a :class:`~ebpo.data.records.Record`, a string, or a list of chat messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, get_args

from ebpo.data.records import Record
from ebpo.errors import ConfigError
from ebpo.registry import check_choice

__all__ = [
    "CHAT_TEMPLATE_SETTINGS",
    "ChatTemplateSetting",
    "Prompt",
    "PromptFormat",
    "apply_chat_template",
    "conversation",
    "has_chat_template",
    "prompt_text",
]

ChatTemplateSetting: TypeAlias = Literal["auto", "on", "off"]
CHAT_TEMPLATE_SETTINGS: tuple[str, ...] = get_args(ChatTemplateSetting)

Prompt: TypeAlias = Record | str | list[Any]
"""A problem's prompt: a record (its ``extra["messages"]`` when a loader kept a conversation, else its
``prompt``; any object with those fields reads the same), a string, or a list of chat messages (``{"role",
"content"}``)."""


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def conversation(prompt: Prompt, system_prompt: str | None = None) -> list[dict[str, Any]]:
    """The chat messages of a prompt: a record's kept conversation (DAPO), else one user turn with its text; a
    list of messages as it is (copied). ``system_prompt`` is put first unless the conversation has one."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list):
        messages = [dict(m) for m in prompt]
    else:  # a record, or an object with its prompt (and extra) fields
        kept = (getattr(prompt, "extra", None) or {}).get("messages") or []
        messages = [dict(m) for m in kept] or [{"role": "user", "content": prompt.prompt}]
    if system_prompt is not None and (not messages or messages[0].get("role") != "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def prompt_text(prompt: Prompt) -> str:
    """The plain text of a prompt: a record's ``prompt``, a string as it is, or a conversation's last user
    message (its last message when none is a user's)."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list):  # a record, or an object with its prompt field
        return prompt.prompt
    users = [m["content"] for m in prompt if m.get("role", "user") == "user"]
    return str(users[-1] if users else prompt[-1]["content"])


def apply_chat_template(
    prompts: Sequence[Prompt],
    tokenizer: Any,
    *,
    system_prompt: str | None = None,
    add_generation_prompt: bool = True,
) -> list[str]:
    """Render each prompt's :func:`conversation` through ``tokenizer.apply_chat_template`` (text, not ids).

    Raises ``ValueError`` if the tokenizer has no chat template (base models read the raw prompt:
    :class:`PromptFormat` chooses).
    """
    if not has_chat_template(tokenizer):
        raise ValueError(
            f"{type(tokenizer).__name__} has no chat_template; use the raw prompts for a base model, "
            f"or set tokenizer.chat_template"
        )
    return [
        tokenizer.apply_chat_template(
            conversation(prompt, system_prompt), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        for prompt in prompts
    ]


@dataclass(frozen=True)
class PromptFormat:
    """How prompts become a model's input (module docstring): through the chat template (``chat``) or raw."""

    tokenizer: Any
    chat: bool
    system_prompt: str | None = None
    """A system message put before each conversation that has none (chat only)."""

    @classmethod
    def resolve(
        cls,
        tokenizer: Any,
        setting: str = "auto",
        *,
        option: str = "chat_template",
        source: object = None,
        system_prompt: str | None = None,
    ) -> PromptFormat:
        """The format a ``setting`` (auto | on | off) gives with ``tokenizer``: ``auto`` is chat when the tokenizer
        has a template. ``option`` (the key or flag, e.g. ``data.chat_template``) and ``source`` (the model's
        path) word the error of ``on`` without a template, and of an unknown setting."""
        try:
            check_choice(f"{option} setting", setting, CHAT_TEMPLATE_SETTINGS)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if setting == "off":
            return cls(tokenizer, chat=False, system_prompt=system_prompt)
        if setting == "on" and not has_chat_template(tokenizer):
            where = f"the tokenizer of {source}" if source is not None else "the tokenizer"
            raise ConfigError(
                f"{option}=on, but {where} has no chat template; set {option}=off (or auto) to use the raw "
                "prompts, or give the tokenizer a template (chat_template.jinja beside tokenizer_config.json)"
            )
        return cls(tokenizer, chat=has_chat_template(tokenizer), system_prompt=system_prompt)

    @property
    def setting(self) -> ChatTemplateSetting:
        """``on`` or ``off``: this format as a setting that resolves to it again."""
        return "on" if self.chat else "off"

    def texts(self, prompts: Sequence[Prompt]) -> list[str]:
        """What the model reads, as text: the rendered template, or each prompt's text."""
        if self.chat:
            return apply_chat_template(prompts, self.tokenizer, system_prompt=self.system_prompt)
        return [prompt_text(prompt) for prompt in prompts]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of texts from :meth:`texts`: a rendered template already holds its special tokens, so
        none are added; raw text gets the tokenizer's own (its BOS, if it adds one): ``tokenizer(text)``."""
        if self.chat:
            return [list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
        return [list(self.tokenizer(text)["input_ids"]) for text in texts]

    def ids(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        """What the model reads, as token ids: :meth:`encode` of :meth:`texts`."""
        return self.encode(self.texts(prompts))
