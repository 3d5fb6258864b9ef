"""What a run trains: a model factory (a built-in VGG, or the user's) and its data.

A model factory is any callable that returns a ``torch.nn.Module``; the server builds the
initial global model with it (after seeding torch), each device builds its own copy. On the
command line a factory is named ``package.module:function``. A device never imports what the
server names: it uses its own factory (``--model``), or a built-in one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from typing import Any

from torch import nn

from tensorwire.fl.config import CUSTOM, is_builtin_model, is_factory_ref
from tensorwire.fl.errors import FLError, ModelMismatch
from tensorwire.fl.models import build_model
from tensorwire.fl.train import StateDict

ModelFactory = Callable[[], nn.Module]


def import_factory(ref: str) -> ModelFactory:
    """The function ``package.module:function`` names; :class:`FLError` says what is wrong."""
    if not is_factory_ref(ref):
        raise FLError(f"{ref!r} is not package.module:function")
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise FLError(f"cannot import {module_name!r} for the model {ref!r}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise FLError(f"{module_name!r} has no {attr!r} (the model {ref!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FLError(f"the model {ref!r} is not a function")
    return obj


def model_factory(model: str | ModelFactory, num_classes: int = 10) -> ModelFactory:
    """A factory from a built-in name (``vgg5``, ``vgg8``), ``package.module:function``, or a
    callable (returned as is)."""
    if callable(model):
        return model
    if is_builtin_model(model):
        return partial(build_model, model, num_classes)
    if model == CUSTOM:
        raise FLError("this run trains the user's own model: give the model factory")
    return import_factory(model)


def factory_name(factory: ModelFactory) -> str:
    """``module:qualname`` of a function that can be imported by name, else ``custom``."""
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", None)
    if module and qualname and module != "__main__":
        ref = f"{module}:{qualname}"
        if is_factory_ref(ref):
            return ref
    return CUSTOM


def build(factory: ModelFactory) -> nn.Module:
    """Call ``factory``; :class:`FLError` if it does not give a ``torch.nn.Module``."""
    model = factory()
    if not isinstance(model, nn.Module):
        raise FLError(f"the model factory returned {type(model).__name__}, not a torch.nn.Module")
    return model


def check_same_model(mine: StateDict, theirs: StateDict, whose: str) -> None:
    """:class:`ModelMismatch` naming up to five entries where ``theirs`` differs from ``mine``."""
    problems = [f"{k} missing" for k in mine if k not in theirs]
    problems += [f"{k} unexpected" for k in theirs if k not in mine]
    for k, v in mine.items():
        t = theirs.get(k)
        if t is not None and (t.shape != v.shape or t.dtype != v.dtype):
            problems.append(f"{k} is {t.dtype}{list(t.shape)}, here {v.dtype}{list(v.shape)}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ModelMismatch(
            f"{whose} model differs from this one: {'; '.join(problems[:5])}{more}; "
            "both sides must build the same model"
        )
