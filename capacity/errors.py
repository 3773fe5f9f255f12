"""Domain errors. They carry the numbers a user needs; the CLI prints them as one line and exits 1."""


class CapacityError(Exception):
    """A problem with the user's input or scenario (not a bug): printed as one line, exit code 1."""


class ConfigError(CapacityError):
    """A file or field is malformed: names the file, the field path and the bad value."""


class DoesNotFit(CapacityError):
    """The scenario is well-formed but the model, or one request of max_model_len, does not fit."""
