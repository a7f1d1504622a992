"""The one exception class for expected user-facing errors."""


class ServelabError(Exception):
    """An expected failure with a message meant for a person: what is wrong and what to do.

    The CLI and the workflow print it on one line, without a traceback.
    """
