"""The one error type the engine raises for bad input (its message says what is wrong and what to do), and the
readers' internal signal that a preview cannot answer exactly."""


class ProfileError(Exception):
    """A profile cannot be opened or a request cannot be answered; str(err) is shown to the user."""


class NoPreview(Exception):
    """A reader's `preview` cannot match the full reader exactly for this profile: the store answers instead
    (never shown to the user; model/trace.py)."""


SHOWN_PATH_CHARS = 200


def shown_path(path: object) -> str:
    """A path as error messages echo it: at most ~200 characters (head and tail kept, the middle elided).
    Control characters are escaped by the renderers, not here: structured errors keep the raw text."""
    text = str(path)
    if len(text) <= SHOWN_PATH_CHARS:
        return text
    keep = SHOWN_PATH_CHARS // 2 - 2
    return f"{text[:keep]}…{text[-keep:]} ({len(text)} characters)"
