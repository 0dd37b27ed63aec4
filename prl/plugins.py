"""Code a config names as ``module:attribute``: the reward (``producer.reward``) and a problem
sampler of your own (``scheduler.strategy``). The config is the operator's; topics never name code."""

from __future__ import annotations

import importlib
import inspect


class PluginError(ValueError):
    """A ``module:attribute`` setting that names nothing loadable (one line: the setting and why)."""


def load(spec: str, setting: str, called_with: tuple[str, ...] = ()):
    """The object ``spec`` names, or PluginError naming ``setting``; with ``called_with`` (the
    arguments' names), also where its signature cannot take them positionally."""
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
    if called_with and (why := unfit_signature(obj, called_with)):
        raise PluginError(f"{setting} {spec!r}: {name} cannot be called as {name}({', '.join(called_with)}): {why}")
    return obj


def unfit_signature(obj, args: tuple[str, ...]) -> str:
    """Why ``obj`` cannot be called with ``args`` positionally ("" if it can, or if its
    signature cannot be read, as of some built-in functions)."""
    try:
        signature = inspect.signature(obj)
    except (ValueError, TypeError):  # no signature to read: the call will tell
        return ""
    try:
        signature.bind(*args)
    except TypeError as exc:
        return str(exc)
    return ""
