"""The one exception type for bad user input, shared by every command.

A `UserError` reaches the user as one line on stderr and exit code 2 (see `cli.main`); its message
names the field or knob, the value, and the fix. Anything else escaping a command is a bug in the
bench and keeps its traceback.
"""


class UserError(ValueError):
    """Bad input from the user (a file, a flag, a knob): one line naming the field and the fix."""


class ConfigError(UserError):
    """Invalid configuration; the message is one line naming the knob, the value and the fix."""
