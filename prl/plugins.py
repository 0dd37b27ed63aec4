"""Code a config names as ``module:attribute``: the reward (``producer.reward``) and a problem
sampler of your own (``scheduler.strategy``). The config is the operator's; topics never name code."""

from __future__ import annotations

import importlib
import inspect


# Calls of a plugin (a reward; an environment, by episode) that failed the same way from the
# first on, with no success among them, that make it broken, not unlucky (a typo, a missing
# package, a judge that refuses every connection): two generation calls of the default size (16
# dispatches x 8). One that fails on some inputs only differs in its errors, or succeeds on others.
BROKEN_AFTER = 256


class PluginError(ValueError):
    """A ``module:attribute`` setting that names nothing loadable, or code that cannot work (one
    line: the setting and why)."""


class FailingFromTheStart:
    """Whether each call of a plugin so far failed as its first did (time-outs aside, not passed
    here), BROKEN_AFTER times at least: then the service stops, saying why, instead of scoring
    everything 0 for ever."""

    def __init__(self):
        self.first, self.same, self.failures, self.successes = "", 0, 0, 0

    def failed(self, described: str) -> None:
        self.first = self.first or described
        self.same += described == self.first
        self.failures += 1

    def succeeded(self) -> None:
        self.successes += 1

    def broken(self) -> bool:
        return not self.successes and self.same == self.failures >= BROKEN_AFTER


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
