"""Code a config names as ``module:attribute``: the reward (``producer.reward``) and a problem
sampler of your own (``scheduler.strategy``). The config is the operator's; topics never name code."""

from __future__ import annotations

import importlib


class PluginError(ValueError):
    """A ``module:attribute`` setting that names nothing loadable (one line: the setting and why)."""


def load(spec: str, setting: str):
    """The object ``spec`` names, or PluginError naming ``setting``."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise PluginError(f"{setting} {spec!r}: expected module:attribute")
    try:
        obj = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise PluginError(f"{setting} {spec!r}: cannot import {module} ({exc})") from None
    except AttributeError:
        raise PluginError(f"{setting} {spec!r}: {module} has no {name}") from None
    if not callable(obj):
        raise PluginError(f"{setting} {spec!r}: {name} is not callable")
    return obj
