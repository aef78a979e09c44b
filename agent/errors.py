"""Errors shared by modules that must not import each other (:mod:`agent.config` reads token files
through :mod:`agent.auth`; both report bad input the same way)."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad configuration: the message names the flag, the bad value and what was expected (exit 2)."""
