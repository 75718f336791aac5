"""User-facing errors: one line that says what is wrong and what to do (the CLI prints it, exits 2)."""


class AutoparError(Exception):
    """Bad user input or a model autopar cannot handle. The message is shown as-is, without traceback."""


class ModelMismatch(AutoparError):
    """The solver's model and the cost model disagree about a solution: a bug in autopar, never a plan.
    The message names the term that differs."""


class NoValidConfiguration(AutoparError):
    """No split of the GPUs (tp × pp × dp, micro-batches) satisfies the divisibility rules and the pins: the
    numbers do not divide, whatever the memory. The message names the rule and the change that satisfies it."""


class DoesNotFit(AutoparError):
    """Valid configurations exist but none fits in memory; the message names the smallest change that would."""


class Stopped(AutoparError):
    """Ctrl-C stopped the work before it had a result to keep (the CLI exits 130, as a shell does after SIGINT)."""


class ModelNotNamed(AutoparError):
    """A plan's figure needs its model, and the user named none: a plan's ``model.source`` is code, run only when
    the user names the model (MODEL) or trusts the plan (--trust-plan-model). The message says how."""
