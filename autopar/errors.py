"""User-facing errors: one line that says what is wrong and what to do (the CLI prints it, exits 2)."""


class AutoparError(Exception):
    """Bad user input or a model autopar cannot handle. The message is shown as-is, without traceback."""


class ModelMismatch(AutoparError):
    """The solver's model and the cost model disagree about a solution: a bug in autopar, never a plan.
    The message names the term that differs."""
