"""The one exception type the planner raises for bad user input."""


class PlannerError(Exception):
    """Bad input (trace, plan, CLI argument): the message is one line naming the file/field and the problem.

    The CLI prints ``error: <message>`` and exits non-zero; it never shows a traceback for these.
    """
