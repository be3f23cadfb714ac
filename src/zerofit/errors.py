"""The one exception type for bad user input: the CLI prints its message on one line and exits 2."""


class UserError(Exception):
    """A problem with what the user gave us (file, config, flags). Never a bug in zerofit."""
