"""The one error type the engine raises for bad input: its message says what is wrong and what to do."""


class ProfileError(Exception):
    """A profile cannot be opened or a request cannot be answered; str(err) is shown to the user."""
