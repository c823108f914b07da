"""``with`` support for the clients: leaving the block calls ``close()``."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
