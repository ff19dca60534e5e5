"""Settings dataclasses, declared once, read from YAML files, dotted ``key=value`` overrides and flags.

A settings dataclass declares each option once: its type (``Literal[...]`` for a fixed set of choices), its
default, ``metadata["help"]`` and, through :func:`option`, the bounds its value keeps. A field whose type is
itself a dataclass is a section, so sections nest (``TrainConfig.algorithm.ebpo``). How options combine is
checked in the dataclass's own ``__post_init__``, whose ``ValueError`` says the fix. This package reads such
dataclasses from what a user types, for every command, one concern a module:

- :mod:`~ebpo.settings.files`: YAML files and dotted overrides as nested mappings (:func:`read_yaml`,
  :func:`parse_override`, :func:`merge`, :func:`rename_keys`);
- :mod:`~ebpo.settings.fields`: a mapping made a checked instance (:func:`build`, :func:`check`), the
  declaration of a field's bounds (:func:`option`), every key listed (:func:`describe`);
- :mod:`~ebpo.settings.flags`: flags generated from flat dataclasses with ``transformers.HfArgumentParser``
  (:func:`dataclass_parser`, :func:`from_args`), ``--config FILE`` beside them;
- :mod:`~ebpo.settings.command`: a command whose parser is built only when it runs, after its plugins are
  imported (:func:`add_command`), and :func:`command_prefix`.

Importing the package imports the standard library only (``transformers`` when a command's parser is built,
PyYAML when a file is read): ``ebpo --help`` stays fast.
"""

from __future__ import annotations

from ebpo.settings.command import add_command, command_prefix
from ebpo.settings.fields import (
    build,
    check,
    check_value,
    coerce,
    describe,
    field_default,
    is_section,
    leaves,
    nearest_key,
    option,
    unknown_keys,
    unknown_keys_message,
)
from ebpo.settings.files import (
    apply_overrides,
    merge,
    merge_dicts,
    parse_override,
    parse_yaml,
    read_yaml,
    rename_keys,
)
from ebpo.settings.flags import (
    CONFIG_FILE,
    DefaultsHelpFormatter,
    RawDescriptionDefaultsHelpFormatter,
    comma_tuple,
    dataclass_parser,
    from_args,
)

__all__ = [
    "CONFIG_FILE",
    "DefaultsHelpFormatter",
    "RawDescriptionDefaultsHelpFormatter",
    "add_command",
    "apply_overrides",
    "build",
    "check",
    "check_value",
    "coerce",
    "comma_tuple",
    "command_prefix",
    "dataclass_parser",
    "describe",
    "field_default",
    "from_args",
    "is_section",
    "leaves",
    "merge",
    "merge_dicts",
    "nearest_key",
    "option",
    "parse_override",
    "parse_yaml",
    "read_yaml",
    "rename_keys",
    "unknown_keys",
    "unknown_keys_message",
]
