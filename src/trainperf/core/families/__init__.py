"""The model families, by ``model.family``: one :class:`ModelFamily` each (its torch-free half; the
torch half is registered under the same name in model/families.py). Code outside a family's own
modules asks the family here -- ``family(spec.model.family).tied_embeddings`` -- and never compares
a family's name.

Adding a family: its module here (a ModelFamily subclass and instance), one ``register`` line
below, its modules in model/ and their line in model/families.py (docs/ARCHITECTURE.md lists the files).
"""

from __future__ import annotations

from trainperf.core.errors import SpecError
from trainperf.core.families.family import ModelFamily
from trainperf.core.families.gpt import GPT_FAMILY
from trainperf.core.families.gpt_oss import GPT_OSS
from trainperf.core.families.llama import LLAMA

FAMILIES: dict[str, ModelFamily] = {}


def register(fam: ModelFamily) -> ModelFamily:
    """Make ``fam`` the family of model.family=fam.name (replacing any of that name)."""
    if not fam.name:
        raise ValueError(f"{type(fam).__name__} has no name")
    FAMILIES[fam.name] = fam
    return fam


def names() -> tuple[str, ...]:
    """The valid model.family values, in registration order."""
    return tuple(FAMILIES)


def family(name: str) -> ModelFamily:
    """The family of model.family=``name``; SpecError naming the valid ones."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise SpecError(f"model.family={name!r}: valid values are {', '.join(FAMILIES)}") from None


for _fam in (LLAMA, GPT_FAMILY, GPT_OSS):
    register(_fam)

__all__ = ["FAMILIES", "ModelFamily", "family", "names", "register"]
