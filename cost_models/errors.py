"""The one exception cost_models raises for an impossible configuration or a bad hardware file."""


class ConfigError(ValueError):
    """A configuration that cannot run (or a profile that cannot be read). The message is one line
    that says what is wrong and what to change; callers show it as-is."""
