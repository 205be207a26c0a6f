"""The command line's user errors: one line, `specdec-fast: error: ...`, exit status 2."""


class CliError(Exception):
    """A user error: printed as the one line `specdec-fast: error: ...`, exit status 2."""


def first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
