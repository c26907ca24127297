"""The lifetime boilerplate of the blocking clients: `with client:` closes the client.

class SomeClient(Closing):
    def close(self) -> None: ...

with SomeClient(...) as client:  # client.close() on leaving, also after an error
    ...
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Closing(ABC):
    """A client used as a context manager: entering gives the client, leaving closes it."""

    @abstractmethod
    def close(self) -> None:
        """Release the client's connections; calls made after this raise ClientError."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["Closing"]
