"""Domain errors. They carry the numbers a user needs; the CLI prints them as one line and exits 1."""


class CapacityError(Exception):
    """A problem with the user's input or scenario (not a bug): printed as one line, exit code 1."""


class ConfigError(CapacityError):
    """A file or field is malformed: names the file, the field path and the bad value."""


class DoesNotFit(CapacityError):
    """The scenario is well-formed but the model, or one request of max_model_len, does not fit."""


def require(module: str, extra: str, what: str) -> None:
    """An optional part the user asked for: present, or one line naming the extra that installs it."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise CapacityError(f"{what} needs {module}, which is not installed: pip install 'capacity[{extra}]'")
