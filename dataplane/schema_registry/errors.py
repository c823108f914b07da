"""The registry's errors as Confluent Schema Registry answers them: an HTTP status and a body
``{"error_code": 40401, "message": "Subject 'x' not found."}`` whose code is the status followed
by a number (or the bare status, as 409 for an incompatible schema)."""

from __future__ import annotations


class RegistryError(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message

    @property
    def status(self) -> int:
        """The HTTP status: the first three digits of the error code."""
        code = self.error_code
        while code >= 1000:
            code //= 10
        return code


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: int | str) -> RegistryError:
    return RegistryError(40402, f"Version {version} not found.")


def schema_not_found(detail: str = "Schema not found") -> RegistryError:
    return RegistryError(40403, detail)


def subject_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(
        40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently"
    )


def subject_not_soft_deleted(subject: str) -> RegistryError:
    return RegistryError(
        40405, f"Subject '{subject}' was not deleted first before being permanently deleted"
    )


def version_soft_deleted(subject: str, version: int) -> RegistryError:
    return RegistryError(
        40406,
        f"Subject '{subject}' Version {version} was soft deleted.Set permanent=true to delete "
        "permanently",
    )


def version_not_soft_deleted(subject: str, version: int) -> RegistryError:
    return RegistryError(
        40407,
        f"Subject '{subject}' Version {version} was not deleted first before being permanently "
        "deleted",
    )


def subject_level_compatibility_not_configured(subject: str) -> RegistryError:
    return RegistryError(
        40408, f"Subject '{subject}' does not have subject-level compatibility configured"
    )


def subject_level_mode_not_configured(subject: str) -> RegistryError:
    return RegistryError(40409, f"Subject '{subject}' does not have subject-level mode configured")


def incompatible(message: str) -> RegistryError:
    return RegistryError(409, message)


def invalid_schema(message: str) -> RegistryError:
    return RegistryError(42201, f"Invalid schema {message}")


def invalid_version(version: str) -> RegistryError:
    return RegistryError(
        42202,
        f"The specified version '{version}' is not a valid version id. Allowed values are "
        'between [1, 2^31-1] and the string "latest"',
    )


def invalid_compatibility_level(level: object) -> RegistryError:
    return RegistryError(
        42203,
        f"Invalid compatibility level. Valid values are none, backward, forward, full, "
        f"backward_transitive, forward_transitive, and full_transitive (got {level!r})",
    )


def invalid_mode(mode: object) -> RegistryError:
    return RegistryError(
        42204, f"Invalid mode. Valid values are READWRITE, READONLY (got {mode!r})"
    )


def operation_not_permitted(message: str) -> RegistryError:
    return RegistryError(42205, message)


def store_error(message: str) -> RegistryError:
    return RegistryError(50001, f"Error in the backend data store - {message}")


def operation_timed_out(message: str) -> RegistryError:
    return RegistryError(50002, f"Operation timed out - {message}")
