"""Errors every layer may raise; this module imports nothing from the package."""


class ConfigError(ValueError):
    """A configuration problem, stated in one line with the key and the fix."""
