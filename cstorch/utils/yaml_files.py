"""Reading a YAML file a run was given (a Trainer params file, a 1.x ``run.py`` params file, a
system administrator's cluster defaults): the one reader the compatibility command lines use.

A params file is plain YAML (mappings, lists, strings, numbers), read with ``safe_load``: no
Python object is built and nothing is called. A tag ``safe_load`` has no constructor for
(``!!python/object/apply:os.system``) is refused with that reason, in one line; a file that
is not YAML says where. The file is foreign: messages quote a short prefix of what it holds.
"""

from __future__ import annotations

import re

from jax_backend.errors import CstorchError, quoted


class YAMLFileError(CstorchError, ValueError):
    """A params file that is not plain YAML."""


def refused_tag(error) -> str | None:
    """The message for a YAML tag ``safe_load`` has no constructor for (``!!python/...``,
    which would build Python objects or call functions), or None for another error."""
    found = re.search(r"constructor for the tag '([^']+)'", str(getattr(error, "problem", "")))
    if not found:
        return None
    tag = found.group(1).replace("tag:yaml.org,2002:", "!!")
    tag = tag if len(tag) <= 80 and tag.isprintable() else quoted(tag)
    mark = getattr(error, "problem_mark", None)
    where = f", line {mark.line + 1}" if mark is not None else ""
    return (
        f"YAML tags are not allowed (`{tag}`){where}: a params file is plain YAML "
        "(mappings, lists, strings, numbers), read without building Python objects. Name "
        "a model, data processor or callback by its import path instead, e.g. "
        "`name: my_package.models:MyModel`."
    )


def load_yaml(stream, path) -> object:
    """``yaml.safe_load(stream)``; YAMLFileError for a refused tag (``refused_tag``) or a file
    that is not YAML (naming ``path``)."""
    import yaml

    try:
        return yaml.safe_load(stream)
    except yaml.constructor.ConstructorError as error:
        raise YAMLFileError(
            refused_tag(error) or f"{path} is not valid YAML: {str(error)[:500]}"
        ) from None
    except yaml.YAMLError as error:
        raise YAMLFileError(f"{path} is not valid YAML: {str(error)[:500]}") from None
